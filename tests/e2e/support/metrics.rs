//! Reading a process's `/metrics` the way Prometheus does: an HTTP GET, then the samples of
//! the text format.

use std::{collections::BTreeSet, net::SocketAddr, path::Path};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The metrics a binary exports only with a collector named.
pub const WITH_A_COLLECTOR: [&str; 2] =
    [platform::otlp::SPANS_ENDED, platform::otlp::SPANS_EXPORTED];

/// The body of `GET /metrics` at `addr`.
pub async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|err| panic!("connect to metrics at {addr}: {err}"));
    // HTTP/1.0: the server closes the connection after the response, so reading to the
    // end reads exactly one response.
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the response");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the sample `name` whose labels include all of `labels`; 0 when there is
/// none (a counter not yet incremented is not exported). Panics if several match.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, series_labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            (series_name == name
                && labels.iter().all(|(key, value)| {
                    series_labels
                        .split(',')
                        .any(|pair| pair == format!("{key}=\"{value}\""))
                }))
            .then(|| value.parse().ok())?
        })
        .collect();
    assert!(
        matching.len() <= 1,
        "several samples of {name} {labels:?}:\n{text}"
    );
    matching.first().copied().unwrap_or(0.0)
}

/// The value of the gauge `name`, which has no labels (or of a counter exported from the
/// start); panics if it is not exported, where [`sample`]'s 0 would pass for a gauge that
/// was never set.
pub fn gauge(text: &str, name: &str) -> f64 {
    assert!(
        exported_names(text).contains(name),
        "{name} is not exported:\n{text}"
    );
    sample(text, name, &[])
}

#[test]
fn samples_are_found_by_name_and_labels() {
    let text = "# HELP x_total help\n# TYPE x_total counter\n\
                x_total{a=\"1\",b=\"2\"} 3\n\
                x_total{a=\"1\",b=\"3\"} 4\n\
                y 7.5\n";
    assert_eq!(sample(text, "x_total", &[("b", "3")]), 4.0);
    assert_eq!(sample(text, "x_total", &[("a", "1"), ("b", "2")]), 3.0);
    assert_eq!(sample(text, "x_total", &[("b", "9")]), 0.0);
    assert_eq!(sample(text, "y", &[]), 7.5);
}

/// The metric names a scrape exports, as PromQL sees them: a histogram `h` as `h_bucket`,
/// `h_sum` and `h_count`.
pub fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The label names a scrape's samples carry (`le` included for histograms).
pub fn label_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| Some(line.split_once('{')?.1.split_once('}')?.0))
        .flat_map(|labels| labels.split(','))
        .filter_map(|pair| pair.split_once('=').map(|(key, _)| key.to_owned()))
        .collect()
}

/// Every PromQL expression in `ops/alerts.yml` (each rule's `expr`, on its line or folded
/// below it) and `ops/dashboard.json` (each panel target's `expr`).
pub fn ops_expressions() -> Vec<String> {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops");
    let alerts = std::fs::read_to_string(ops.join("alerts.yml")).expect("ops/alerts.yml");
    let mut expressions = Vec::new();
    let mut lines = alerts.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('>') || rest.starts_with('|') {
            let indent = line.len() - line.trim_start().len();
            let mut folded = String::new();
            while let Some(next) =
                lines.next_if(|next| next.len() - next.trim_start().len() > indent)
            {
                folded.push_str(next.trim());
                folded.push(' ');
            }
            expressions.push(folded);
        } else {
            expressions.push(rest.to_owned());
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ops.join("dashboard.json")).expect("ops/dashboard.json"),
    )
    .expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            expressions.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    expressions
}

/// The names in a PromQL expression that are neither functions nor keywords: metric and
/// label names. Strings, ranges, numbers and Grafana variables are skipped.
pub fn promql_names(expr: &str) -> Vec<String> {
    const FUNCTIONS_AND_KEYWORDS: &[&str] = &[
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "irate",
        "increase",
        "by",
        "without",
        "on",
        "ignoring",
        "and",
        "or",
        "unless",
        "bool",
        "histogram_quantile",
        "absent",
    ];
    let mut names = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => while chars.next().is_some_and(|c| c != '"') {},
            '[' => while chars.next().is_some_and(|c| c != ']') {},
            '$' => {
                while chars
                    .next_if(|c| c.is_alphanumeric() || "_{}".contains(*c))
                    .is_some()
                {}
            }
            c if c.is_ascii_digit() || c == '.' => {
                while chars
                    .next_if(|c| c.is_ascii_alphanumeric() || *c == '.')
                    .is_some()
                {}
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut name = String::from(c);
                while let Some(c) =
                    chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                {
                    name.push(c);
                }
                if !FUNCTIONS_AND_KEYWORDS.contains(&name.as_str()) {
                    names.push(name);
                }
            }
            _ => {}
        }
    }
    names
}

#[test]
fn promql_names_are_metrics_and_labels_only() {
    assert_eq!(
        promql_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(x_bucket{a=~"b|c"}[5m]))) > 1e3 and on() y"#
        ),
        ["le", "x_bucket", "a", "y"]
    );
    assert_eq!(promql_names("rate(z[$__rate_interval])"), ["z"]);
}

/// Every input series of `ops/alerts.test.yml`: its metric name and its labels, `job` and
/// `instance` (which Prometheus attaches, not a binary) left out.
pub fn alert_test_series() -> Vec<(String, Vec<(String, String)>)> {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops");
    let tests = std::fs::read_to_string(ops.join("alerts.test.yml")).expect("ops/alerts.test.yml");
    tests
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- series:"))
        .map(|series| {
            let series = series
                .trim()
                .strip_prefix('\'')
                .and_then(|series| series.strip_suffix('\''))
                .unwrap_or_else(|| panic!("a series in single quotes: {series}"));
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            let labels = labels
                .strip_suffix('}')
                .expect("labels end in }")
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
                .filter(|(key, _)| key != "job" && key != "instance")
                .collect();
            (name.to_owned(), labels)
        })
        .collect()
}

/// Whether a scrape has a sample `name` carrying the label `key="value"`.
pub fn has_label_value(text: &str, name: &str, key: &str, value: &str) -> bool {
    let pair = format!("{key}=\"{value}\"");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('{'))
        .any(|(series, labels)| {
            series == name
                && labels
                    .split_once('}')
                    .is_some_and(|(labels, _)| labels.split(',').any(|p| p == pair))
        })
}

#[test]
fn alert_test_series_are_read_with_their_labels() {
    let series = alert_test_series();
    assert!(series.len() >= 20, "{series:?}");
    assert!(series.contains(&(
        "outbox_rows".to_owned(),
        vec![("status".to_owned(), "failed".to_owned())]
    )));
    let text = "x_total{a=\"1\",b=\"2\"} 3\n";
    assert!(has_label_value(text, "x_total", "b", "2"));
    assert!(!has_label_value(text, "x_total", "b", "1"));
    assert!(!has_label_value(text, "x", "a", "1"));
}
