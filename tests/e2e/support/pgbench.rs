//! Reading `bench/pgbench/*.sql`, the database-only ceiling's scripts, to hold them to the
//! statements the services run.

/// The SQL of `bench/pgbench/<name>`, without its comments and pgbench's meta-commands.
pub fn script(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bench/pgbench")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    text.lines()
        .filter(|line| !line.starts_with("--") && !line.starts_with('\\'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each `INSERT INTO table (columns)` of `sql`, in order, identifiers unquoted and columns
/// sorted (their order in the statement changes nothing the database does).
pub fn inserts(sql: &str) -> Vec<(String, Vec<String>)> {
    let sql = sql.replace('"', "");
    sql.split("INSERT INTO ")
        .skip(1)
        .map(|rest| {
            let (table, rest) = rest.split_once('(').expect("a column list");
            let (columns, _) = rest.split_once(')').expect("its end");
            let mut columns: Vec<String> =
                columns.split(',').map(|c| c.trim().to_owned()).collect();
            columns.sort();
            (table.trim().to_owned(), columns)
        })
        .collect()
}

/// Whether `sql` is one statement that writes its first row in a `WITH` named `first`
/// (`platform::db::insert_both`).
pub fn inserts_both_in_one_statement(sql: &str) -> bool {
    let sql = sql.replace('"', "");
    sql.trim_start().starts_with("WITH first AS (") && sql.matches("INSERT INTO ").count() == 2
}

/// The statements of `sql` (split at `;`) from their `WITH` on, with every value written
/// the same way: `$n` placeholders, string literals and `now()` become `?`, whitespace one
/// space. What is left is what a statement does: the tables, columns, joins and fences.
pub fn shapes(sql: &str) -> Vec<String> {
    sql.split(';')
        .filter_map(|statement| statement.find("WITH").map(|at| &statement[at..]))
        .map(shape)
        .collect()
}

fn shape(statement: &str) -> String {
    let statement = statement.replace("now()", "?");
    let mut out = String::with_capacity(statement.len());
    let mut chars = statement.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                for inner in chars.by_ref() {
                    if inner == '\'' {
                        break;
                    }
                }
                out.push('?');
            }
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                }
                out.push('?');
            }
            _ => out.push(c),
        }
    }
    out.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("( ", "(")
        .replace(" )", ")")
}
