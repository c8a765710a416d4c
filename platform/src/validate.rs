//! Field rules shared by every RPC, so the same input is judged the same everywhere.
//!
//! Values are checked, never repaired: surrounding whitespace is an error, not something
//! trimmed, so the stored value is always exactly what the caller sent.

use email_address::{EmailAddress, Options};
use uuid::Uuid;

/// One field that failed its rule: the proto field name and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct FieldViolation {
    pub field: &'static str,
    pub reason: String,
}

impl FieldViolation {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// The longest accepted first or last name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// The longest accepted e-mail address, in characters (RFC 5321's path limit).
pub const MAX_EMAIL_CHARS: usize = 254;
/// The longest accepted document number, in characters.
pub const MAX_DOCUMENT_NUMBER_CHARS: usize = 32;
/// The longest accepted idempotency key, in characters.
pub const MAX_KEY_CHARS: usize = 128;

/// Items per page of a List RPC when the caller asks for none, and the most served.
pub const DEFAULT_PAGE_SIZE: u64 = 50;
pub const MAX_PAGE_SIZE: u64 = 500;

/// Where a page of a List RPC starts and how many items it holds: `page_token` is the id
/// of the previous page's last item (empty: the first page); `page_size` 0 asks for the
/// default, more than the most gets the most, and a negative one is refused.
pub fn page(page_size: i32, page_token: &str) -> Result<(Option<Uuid>, u64), FieldViolation> {
    let limit = match u64::try_from(page_size) {
        Ok(0) => DEFAULT_PAGE_SIZE,
        Ok(size) => size.min(MAX_PAGE_SIZE),
        Err(_) => return Err(FieldViolation::new("page_size", "must not be negative")),
    };
    let after = match page_token {
        "" => None,
        token => Some(uuid("page_token", token)?),
    };
    Ok((after, limit))
}

/// A first or last name: 1–100 characters, no control characters (C0 or C1).
pub fn name(field: &'static str, value: &str) -> Result<(), FieldViolation> {
    text(field, value, MAX_NAME_CHARS)?;
    if value.chars().any(char::is_control) {
        return Err(FieldViolation::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A name a person enters at the edge (Student's CreateStudent and UpdateStudent): a
/// [`name`] with no invisible character either, which would make two names that read the
/// same differ, or turn how the text around a name is shown (a right-to-left override;
/// Trojan Source's trick). The joiners some scripts need (the zero-width non-joiner and
/// joiner in Persian and Indic names, the Mongolian vowel separator) stay, but only inside
/// a word: between two characters that are neither spaces nor joiners themselves, nor both
/// ASCII. Which scripts need them is not judged further (no table of scripts is kept), so
/// one between two accented Latin letters passes; nor are variation selectors refused
/// (emoji need them).
///
/// Users checks only [`name`]: it stores what Student sends it, and a student saved before
/// this rule keeps its name there (its outbox rows and later changes carry it).
pub fn student_name(field: &'static str, value: &str) -> Result<(), FieldViolation> {
    name(field, value)?;
    // No format character, joiner or filler is ASCII: most names need no more look.
    if value.is_ascii() {
        return Ok(());
    }
    let chars: Vec<char> = value.chars().collect();
    let visible = |at: usize| {
        chars
            .get(at)
            .is_some_and(|c| !c.is_whitespace() && !is_joiner(*c))
    };
    // ASCII on both sides needs no joiner: it would only hide in a name that reads alike.
    let ascii_around = |at: usize| chars[at - 1].is_ascii() && chars[at + 1].is_ascii();
    let inside_a_word =
        |at: usize| at > 0 && visible(at - 1) && visible(at + 1) && !ascii_around(at);
    let hidden = (0..chars.len())
        .any(|at| is_invisible(chars[at]) || (is_joiner(chars[at]) && !inside_a_word(at)));
    if hidden {
        return Err(FieldViolation::new(
            field,
            "must not contain invisible formatting characters (bidirectional overrides, \
             zero-width spaces, tags)",
        ));
    }
    Ok(())
}

/// The zero-width non-joiner and joiner and the Mongolian vowel separator: format
/// characters that some scripts spell words with.
fn is_joiner(c: char) -> bool {
    matches!(c, '\u{200C}' | '\u{200D}' | '\u{180E}')
}

/// Unicode's format characters (General_Category Cf, Unicode 15.1) but the joiners, and
/// the letters that show nothing: the Hangul fillers and the combining grapheme joiner.
/// The set is small and changes little; it is listed here rather than brought in with a
/// Unicode-tables crate.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{34F}' | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}'
    ) || matches!(
        c,
        '\u{AD}'
            | '\u{600}'..='\u{605}'
            | '\u{61C}'
            | '\u{6DD}'
            | '\u{70F}'
            | '\u{890}'..='\u{891}'
            | '\u{8E2}'
            | '\u{200B}'
            | '\u{200E}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// An e-mail address: syntactically valid, with a dotted domain, at most 254 characters.
pub fn email(field: &'static str, value: &str) -> Result<(), FieldViolation> {
    text(field, value, MAX_EMAIL_CHARS)?;
    let strict = Options::default()
        .with_required_tld()
        .without_domain_literal()
        .without_display_text();
    EmailAddress::parse_with_options(value, strict)
        .map(drop)
        .map_err(|_| FieldViolation::new(field, "must be an e-mail address like name@example.org"))
}

/// A document number: 1–32 ASCII letters, digits or `-`.
pub fn document_number(field: &'static str, value: &str) -> Result<(), FieldViolation> {
    text(field, value, MAX_DOCUMENT_NUMBER_CHARS)?;
    if !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(FieldViolation::new(
            field,
            "must contain only letters, digits and '-'",
        ));
    }
    Ok(())
}

/// An idempotency key: 1–128 characters of `[A-Za-z0-9._:-]`.
pub fn idempotency_key(field: &'static str, value: &str) -> Result<(), FieldViolation> {
    text(field, value, MAX_KEY_CHARS)?;
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
    {
        return Err(FieldViolation::new(
            field,
            "must contain only letters, digits and '.', '_', ':', '-'",
        ));
    }
    Ok(())
}

/// A UUID in its hyphenated form (any case); returns it parsed.
pub fn uuid(field: &'static str, value: &str) -> Result<Uuid, FieldViolation> {
    if value.is_empty() {
        return Err(FieldViolation::new(field, "must not be empty"));
    }
    if value.len() != 36 {
        return Err(FieldViolation::new(field, "must be a hyphenated UUID"));
    }
    Uuid::try_parse(value).map_err(|_| FieldViolation::new(field, "must be a hyphenated UUID"))
}

/// Non-empty, at most `max_chars` characters, no leading or trailing whitespace.
fn text(field: &'static str, value: &str, max_chars: usize) -> Result<(), FieldViolation> {
    if value.is_empty() {
        return Err(FieldViolation::new(field, "must not be empty"));
    }
    if value.chars().count() > max_chars {
        return Err(FieldViolation::new(
            field,
            format!("must be at most {max_chars} characters"),
        ));
    }
    if value.trim() != value {
        return Err(FieldViolation::new(
            field,
            "must not start or end with whitespace",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason<T>(result: Result<T, FieldViolation>) -> String {
        match result {
            Ok(_) => "ok".to_owned(),
            Err(violation) => violation.reason,
        }
    }

    #[test]
    fn student_names_also_reject_invisible_formatting_but_keep_joiners() {
        const INVISIBLE: &str = "must not contain invisible formatting characters (bidirectional overrides, \
             zero-width spaces, tags)";
        for bad in [
            "Ana\u{202E}zeréP",
            "An\u{200B}a",
            "Ana\u{2066}",
            "\u{FEFF}Ana",
            "Ana\u{E0041}",
            "So\u{AD}fía",
            "Ana\u{200F}",
            "\u{3164}",
            // The other Hangul fillers, which show nothing either.
            "\u{115F}",
            "An\u{1160}a",
            "\u{FFA0}Ana",
            "A\u{34F}na",
            // Joiners outside a word: alone, at an end, beside a space or another joiner.
            "\u{200C}",
            "Ana\u{200D}",
            "\u{200C}Ana",
            "Ana \u{200D}Luz",
            "Ana\u{200C}\u{200D}Luz",
            "A\u{200C}na",
            "Ana\u{200D}-Luz",
        ] {
            assert_eq!(
                reason(student_name("first_name", bad)),
                INVISIBLE,
                "{bad:?}"
            );
            // Users' rule lets them through: it stores what Student sends.
            assert_eq!(reason(name("first_name", bad)), "ok", "{bad:?}");
        }
        // Every character of the ranges (each bidirectional embedding, override and
        // isolate, each invisible operator), not only the ones above.
        let ranges = [
            ('\u{200E}', '\u{200F}'),
            ('\u{202A}', '\u{202E}'),
            ('\u{2060}', '\u{2064}'),
            ('\u{2066}', '\u{206F}'),
            ('\u{FFF9}', '\u{FFFB}'),
        ];
        for c in ranges.into_iter().flat_map(|(first, last)| first..=last) {
            let bad = format!("Ana{c}x");
            assert_eq!(
                reason(student_name("first_name", &bad)),
                INVISIBLE,
                "{bad:?}"
            );
        }
        // Persian and Devanagari names written with a non-joiner and a joiner.
        for good in [
            "مهرداد\u{200C}الله",
            "क्\u{200D}ष",
            "ᠨᠠ\u{180E}ᠠ",
            "José María",
            "O'Brien-Núñez",
            "Ana 👩\u{200D}💻",
            // As documented: no table of scripts, so a joiner between two accented Latin
            // letters passes, and a variation selector (emoji need them) is no format
            // character.
            "é\u{200C}é",
            "Ana ❤\u{FE0F}",
        ] {
            assert_eq!(reason(student_name("first_name", good)), "ok", "{good:?}");
        }
        assert_eq!(
            reason(student_name("first_name", "A\u{1b}na")),
            "must not contain control characters"
        );
    }

    #[test]
    fn names_accept_unicode_and_reject_control_characters() {
        assert_eq!(reason(name("first_name", "José María")), "ok");
        assert_eq!(reason(name("first_name", &"é".repeat(100))), "ok");
        assert_eq!(
            reason(name("first_name", &"é".repeat(101))),
            "must be at most 100 characters"
        );
        assert_eq!(
            reason(name("first_name", "Ana\u{0}")),
            "must not contain control characters"
        );
        assert_eq!(
            reason(name("first_name", "Ana\nLuz")),
            "must not contain control characters"
        );
        // C1 controls (NEL, CSI) too, not only ASCII's.
        for bad in ["A\u{85}na", "\u{9b}31mAna"] {
            assert_eq!(
                reason(name("first_name", bad)),
                "must not contain control characters",
                "{bad:?}"
            );
        }
        assert_eq!(reason(name("first_name", "")), "must not be empty");
    }

    #[test]
    fn surrounding_whitespace_is_rejected_not_trimmed() {
        for value in [" Ana", "Ana ", "\tAna", "Ana\u{a0}"] {
            assert_eq!(
                reason(name("first_name", value)),
                "must not start or end with whitespace",
                "{value:?}"
            );
        }
        assert_eq!(
            reason(email("email", " ana@example.edu")),
            "must not start or end with whitespace"
        );
    }

    #[test]
    fn emails_must_be_plain_addresses_with_a_dotted_domain() {
        assert_eq!(reason(email("email", "ana.perez@example.edu")), "ok");
        for bad in [
            "ana",
            "ana@",
            "@example.edu",
            "ana@localhost",
            "Ana <ana@example.edu>",
            "ana@[127.0.0.1]",
        ] {
            assert_eq!(
                reason(email("email", bad)),
                "must be an e-mail address like name@example.org",
                "{bad:?}"
            );
        }
        // ASCII control characters are no part of an address.
        for bad in ["an\na@example.edu", "an\u{0}a@example.edu"] {
            assert_eq!(
                reason(email("email", bad)),
                "must be an e-mail address like name@example.org",
                "{bad:?}"
            );
        }
        let long = format!("{}@example.edu", "a".repeat(250));
        assert_eq!(
            reason(email("email", &long)),
            "must be at most 254 characters"
        );
    }

    #[test]
    fn document_numbers_are_letters_digits_and_dashes() {
        assert_eq!(
            reason(document_number("document_number", "AB-1234-5")),
            "ok"
        );
        assert_eq!(
            reason(document_number("document_number", &"9".repeat(32))),
            "ok"
        );
        assert_eq!(
            reason(document_number("document_number", &"9".repeat(33))),
            "must be at most 32 characters"
        );
        assert_eq!(
            reason(document_number("document_number", "12 34")),
            "must contain only letters, digits and '-'"
        );
        assert_eq!(
            reason(document_number(
                "document_number",
                "12'; DROP TABLE users;--"
            )),
            "must contain only letters, digits and '-'"
        );
        // Nothing else that is often found in document numbers, and no letter beyond ASCII.
        for other in ["AB_12", "AB.12", "AB/12", "AB+12", "Ñ-12"] {
            assert_eq!(
                reason(document_number("document_number", other)),
                "must contain only letters, digits and '-'",
                "{other}"
            );
        }
    }

    #[test]
    fn keys_allow_a_small_safe_alphabet() {
        assert_eq!(
            reason(idempotency_key("idempotency_key", "order:42_v1.retry-3")),
            "ok"
        );
        assert_eq!(
            reason(idempotency_key("idempotency_key", &"k".repeat(128))),
            "ok"
        );
        assert_eq!(
            reason(idempotency_key("idempotency_key", &"k".repeat(129))),
            "must be at most 128 characters"
        );
        assert_eq!(
            reason(idempotency_key("idempotency_key", "a/b")),
            "must contain only letters, digits and '.', '_', ':', '-'"
        );
        assert_eq!(
            reason(idempotency_key("idempotency_key", "")),
            "must not be empty"
        );
    }

    #[test]
    fn ids_must_be_hyphenated_uuids() {
        let id = uuid("id", "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a").expect("valid uuid");
        assert_eq!(id.to_string(), "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a");
        assert!(uuid("id", "0193A6A4-7F3E-7C1A-9A55-3C2F1E0D4B8A").is_ok());
        assert_eq!(reason(uuid("id", "")), "must not be empty");
        assert_eq!(reason(uuid("id", "42")), "must be a hyphenated UUID");
        assert_eq!(
            reason(uuid("id", "0193a6a47f3e7c1a9a553c2f1e0d4b8a")),
            "must be a hyphenated UUID"
        );
        assert_eq!(
            reason(uuid("id", "zzzzzzzz-7f3e-7c1a-9a55-3c2f1e0d4b8a")),
            "must be a hyphenated UUID"
        );
    }

    #[test]
    fn violations_name_their_field() {
        let violation = name("last_name", "").expect_err("empty name");
        assert_eq!(
            violation.to_string(),
            "invalid last_name: must not be empty"
        );
    }
}
