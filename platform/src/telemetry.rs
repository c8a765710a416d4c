//! Logging for every binary: lines on stderr (stdout is kept for command output such as
//! `relay status`), filtered by `RUST_LOG` (default `info`), as readable text or as JSON
//! lines (`--log-format`, env `LOG_FORMAT`).
//!
//! Work on one student runs inside a span with a `trace_id` field (see `trace.rs`). In text
//! each line shows its spans' fields (`CreateStudent{trace_id=…}: …`); in JSON each line
//! carries `trace_id` as a top-level field, so `grep <trace_id>` finds the journey either way.
//!
//! Lines are written by a thread of their own, never by the code that logs, from a bounded
//! queue that drops and counts lines rather than wait for a reader that does not read
//! (`log_writer.rs` says why and what a crash loses).

use std::{fmt, io::IsTerminal as _, sync::OnceLock, time::Duration};

use anyhow::Context as _;

pub use crate::log_writer::LogWriter;
use crate::log_writer::{GATHER, Limits, Lines};

use serde_json::{Map, Value};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{
    EnvFilter, Layer,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    layer::Context,
    prelude::*,
    registry::LookupSpan,
};

/// The span field that names a trace.
pub const TRACE_ID_FIELD: &str = "trace_id";

/// The target of the one line each service logs once it listens (`addr=HOST:PORT`). Tools
/// that start a service on port 0 learn its port from that line (devstack, loadgen), so a
/// quieter level keeps it: `RUST_LOG=warn,listening=info`.
pub const LISTENING_TARGET: &str = "listening";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, span, trace_id, message, fields.
    Json,
}

/// How much may wait for the writer before new lines are dropped: seconds of a busy
/// service's lines at `info`, and never more than a few megabytes of long ones.
const QUEUED: Limits = Limits {
    lines: 10_000,
    bytes: 4 << 20,
};

/// Where [`dropped_lines`] reads the writer's count, once [`init`] has run.
static LOG_LINES: OnceLock<Lines> = OnceLock::new();

/// How long a process that ends waits for its queued lines to be written.
const FINAL_WRITE: Duration = Duration::from_millis(1200);

/// Installs the global subscriber; call once, first thing in `main` after parsing flags,
/// and keep what it returns until `main` ends.
pub fn init(format: LogFormat) -> anyhow::Result<LogWriter> {
    let (writer, lines) = LogWriter::start(std::io::stderr(), QUEUED, GATHER, FINAL_WRITE)
        .context("cannot start the log writer")?;
    let _ = LOG_LINES.set(lines.clone());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer().with_writer(lines);
    let (lines, trace_ids) = match format {
        LogFormat::Text => (
            lines.with_ansi(std::io::stderr().is_terminal()).boxed(),
            None,
        ),
        LogFormat::Json => (lines.event_format(JsonLines).boxed(), Some(TraceIdLayer)),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(trace_ids)
        .with(lines)
        .init();
    Ok(writer)
}

/// Log lines dropped so far: the writer's queue was full (its reader was not reading), or
/// writing them failed (its reader went away); 0 before [`init`].
pub fn dropped_lines() -> u64 {
    LOG_LINES.get().map_or(0, Lines::dropped_lines)
}

/// The `trace_id` of a span, kept where [`JsonLines`] finds it.
struct TraceId(String);

/// Remembers each span's `trace_id`, whether given when the span opens or recorded later.
struct TraceIdLayer;

impl<S> Layer<S> for TraceIdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut found = TraceIdVisitor(None);
        attrs.record(&mut found);
        if let (Some(trace_id), Some(span)) = (found.0, ctx.span(id)) {
            span.extensions_mut().insert(TraceId(trace_id));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let mut found = TraceIdVisitor(None);
        values.record(&mut found);
        if let (Some(trace_id), Some(span)) = (found.0, ctx.span(id)) {
            span.extensions_mut().replace(TraceId(trace_id));
        }
    }
}

struct TraceIdVisitor(Option<String>);

impl Visit for TraceIdVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == TRACE_ID_FIELD {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == TRACE_ID_FIELD {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// Writes each event as one JSON object.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        if let Some(scope) = ctx.event_scope() {
            let mut spans = scope.peekable();
            if let Some(innermost) = spans.peek() {
                line.insert("span".into(), innermost.name().into());
            }
            let trace_id = spans.find_map(|span| {
                span.extensions()
                    .get::<TraceId>()
                    .map(|TraceId(id)| id.clone())
            });
            if let Some(trace_id) = trace_id {
                line.insert(TRACE_ID_FIELD.into(), trace_id.into());
            }
        }
        event.record(&mut JsonFields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields (`message` among them) as JSON values.
struct JsonFields<'a>(&'a mut Map<String, Value>);

impl Visit for JsonFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README ("Logs"): lines wait in a queue of 10,000, at most 4 MiB, written at most
    /// once every 5 ms (what a crash may lose), and a stop waits about a second for them.
    #[test]
    fn the_log_queue_is_as_readme_says() {
        assert_eq!((QUEUED.lines, QUEUED.bytes), (10_000, 4 << 20));
        assert_eq!(GATHER, std::time::Duration::from_millis(5));
        assert!(FINAL_WRITE <= std::time::Duration::from_millis(1500));
    }
}
