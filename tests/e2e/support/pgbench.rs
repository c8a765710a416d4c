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
