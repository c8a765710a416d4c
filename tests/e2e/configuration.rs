//! README's configuration table held to the binaries themselves: every flag it lists exists
//! where it says, with that environment variable and that default (as `--help` prints
//! them), and every flag a binary reads from the environment is in the table. A flag added,
//! renamed or given a new default without the README fails here; so does a fail point.

use std::{collections::BTreeMap, process::Command};

use crate::support::stack::binaries;

/// What `--help` says about one option.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Option_ {
    env: Option<String>,
    default: Option<String>,
}

/// The options of `command` (a binary, then its arguments), by flag.
fn help(command: &[&str]) -> BTreeMap<String, Option_> {
    let output = Command::new(binaries().join(command[0]))
        .args(&command[1..])
        .arg("--help")
        .env_clear()
        .output()
        .expect("run --help");
    assert!(output.status.success(), "{command:?} --help");
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let mut options = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(flag) = line
            .strip_prefix("--")
            .and_then(|rest| rest.split_whitespace().next())
        {
            current = Some(format!("--{flag}"));
            options.insert(
                format!("--{flag}"),
                Option_ {
                    env: None,
                    default: None,
                },
            );
            continue;
        }
        let Some(option) = current.as_ref().and_then(|flag| options.get_mut(flag)) else {
            continue;
        };
        if let Some(env) = line.strip_prefix("[env: ") {
            option.env = Some(env.trim_end_matches(']').trim_end_matches('=').to_owned());
        } else if let Some(default) = line.strip_prefix("[default: ") {
            option.default = Some(default.trim_end_matches(']').to_owned());
        }
    }
    options
}

/// One row of the table: the binary cell, its flags and variables (paired in order), and
/// the default cell.
struct Row {
    binary: String,
    flags: Vec<String>,
    envs: Vec<String>,
    default: String,
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn table() -> Vec<Row> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme
        .find("| binary | flag | env | default |")
        .expect("the configuration table");
    readme[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "{line}");
            Row {
                binary: cells[0].trim_matches('`').to_owned(),
                flags: backticked(cells[1]),
                envs: backticked(cells[2]),
                default: cells[3].to_owned(),
            }
        })
        .collect()
}

/// The `--help` invocations a row's binary cell stands for.
fn commands(binary: &str) -> Vec<&'static [&'static str]> {
    const STUDENT: &[&str] = &["student-svc"];
    const USERS: &[&str] = &["users-svc"];
    const RELAY: &[&str] = &["relay"];
    const RELAY_RUN: &[&str] = &["relay", "run"];
    match binary {
        "student-svc" => vec![STUDENT],
        "users-svc" => vec![USERS],
        // `relay`'s flags are global: `relay run` takes them too.
        "relay" => vec![RELAY, RELAY_RUN],
        "relay run" => vec![RELAY_RUN],
        "all" => vec![STUDENT, USERS, RELAY, RELAY_RUN],
        other => panic!("unknown binary {other:?} in README's configuration table"),
    }
}

/// The default a README cell gives: the first `code` when the cell starts with it; a
/// "same as B" cell, binary B's; any other wording ("none", "the system's roots") none.
fn readme_default(cell: &str, flag: &str) -> Option<String> {
    if cell.starts_with('`') {
        return backticked(cell).into_iter().next();
    }
    if let Some(other) = cell.strip_prefix("same as ") {
        let other = other.split_whitespace().next().unwrap_or_default();
        return help(&[other])
            .remove(flag)
            .unwrap_or_else(|| panic!("{other} has no {flag}"))
            .default;
    }
    None
}

#[test]
fn the_readme_configuration_table_matches_every_binarys_help() {
    let rows = table();
    assert!(rows.len() >= 40, "{} rows", rows.len());
    let mut documented: Vec<(&'static [&'static str], String)> = Vec::new();
    for row in &rows {
        if row.flags.is_empty() {
            continue; // RUST_LOG: an environment variable with no flag
        }
        assert_eq!(row.flags.len(), row.envs.len(), "{}", row.flags.join(", "));
        for command in commands(&row.binary) {
            let options = help(command);
            for (flag, env) in row.flags.iter().zip(&row.envs) {
                let option = options
                    .get(flag)
                    .unwrap_or_else(|| panic!("{command:?} has no {flag} (README says it has)"));
                assert_eq!(option.env.as_ref(), Some(env), "{command:?} {flag}: env");
                let default = if row.flags.len() == 1 {
                    readme_default(&row.default, flag)
                } else {
                    // Several flags share the cell: it can only say they have none.
                    assert!(row.default.starts_with("none"), "{}", row.default);
                    None
                };
                assert_eq!(
                    option.default, default,
                    "{command:?} {flag}: default (README: {})",
                    row.default
                );
                documented.push((command, flag.clone()));
            }
        }
    }
    // The other way round: every option a binary reads from the environment is in the table.
    for command in [
        &["student-svc"][..],
        &["users-svc"],
        &["relay"],
        &["relay", "run"],
    ] {
        for (flag, option) in help(command) {
            if option.env.is_some() {
                assert!(
                    documented.contains(&(command, flag.clone())),
                    "{command:?} {flag} ({:?}) is not in README's configuration table",
                    option.env
                );
            }
        }
    }
}

/// README's "Fail points" lists every point the code names (`platform::failpoint::points`)
/// and no other: a point added, renamed or dropped without the README fails here.
#[test]
fn the_readme_lists_every_fail_point_and_no_other() {
    let read = |path: &str| {
        std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|err| panic!("{path}: {err}"))
    };
    let code = read("platform/src/failpoint.rs");
    let points = &code[code.find("pub mod points {").expect("the points")..];
    let points = &points[..points.find("\n}").expect("their end")];
    let in_code: std::collections::BTreeSet<String> = points
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub const "))
        .filter_map(|line| line.split('"').nth(1))
        .map(str::to_owned)
        .collect();
    assert!(in_code.len() >= 10, "{in_code:?}");
    let readme = read("README.md");
    let section = &readme[readme.find("### Fail points").expect("the section")..];
    let section = &section[..section[4..].find("\n### ").expect("its end") + 4];
    // Code blocks out first: a fence's three backticks would shift the pairs.
    let prose: String = section.split("```").step_by(2).collect::<Vec<_>>().join("");
    let in_readme: std::collections::BTreeSet<String> = backticked(&prose)
        .into_iter()
        .filter(|name| {
            ["student-", "relay-", "users-"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                && name.chars().all(|c| c.is_ascii_lowercase() || c == '-')
        })
        .collect();
    assert_eq!(in_readme, in_code);
}
