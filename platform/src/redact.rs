//! Masks for personal data in logs. E-mail addresses and document numbers never appear in
//! clear in any log line; where a line needs to tell records apart, it shows these masks.

/// `ana.perez@example.edu` → `a***@example.edu`; anything without `@` → `***`.
pub fn email(value: &str) -> String {
    match value.split_once('@') {
        Some((local, domain)) => {
            let first = local.chars().next().map(String::from).unwrap_or_default();
            format!("{first}***@{domain}")
        }
        None => "***".to_owned(),
    }
}

/// `DOC-1001` → `***01`: the last two characters, and only for values of five or more.
pub fn document_number(value: &str) -> String {
    let chars: Vec<char> = value.chars().collect();
    if chars.len() < 5 {
        return "***".to_owned();
    }
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("***{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_keep_only_the_first_letter_and_the_domain() {
        assert_eq!(email("ana.perez@example.edu"), "a***@example.edu");
        assert_eq!(email("@example.edu"), "***@example.edu");
        assert_eq!(email("not-an-email"), "***");
    }

    #[test]
    fn document_numbers_keep_only_the_last_two_characters() {
        assert_eq!(document_number("DOC-1001"), "***01");
        assert_eq!(document_number("12345"), "***45");
        assert_eq!(document_number("1234"), "***");
        assert_eq!(document_number(""), "***");
    }
}
