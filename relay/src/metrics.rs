//! The relay's metrics (served by `platform::metrics` when `--metrics-addr` is given).
//!
//! The gauges are read from the Student DB, so every relay reports the whole outbox, right
//! however many relays run; the counters and histograms are this relay's own work.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use student_store::outbox::{self, BatchPath, DoneCount, OutboxReport};
use tokio_util::sync::CancellationToken;

pub const DELIVERIES: &str = "relay_deliveries_total";
pub const USERS_CALL_SECONDS: &str = "relay_users_call_seconds";
pub const LINK_LATENCY_SECONDS: &str = "outbox_link_latency_seconds";
pub const OUTBOX_ROWS: &str = "outbox_rows";
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
pub const IN_FLIGHT_LIMIT: &str = "relay_in_flight_limit";
pub const FINALIZE_BATCHES: &str = "relay_finalize_batches_total";
pub const WAKEUPS_LISTENING: &str = "relay_wakeups_listening";
pub const WAKEUP_LOSSES: &str = "relay_wakeup_losses_total";
pub const WAKEUPS: &str = "relay_wakeups_total";

/// How often the gauges are read from the database. Each read touches only the rows still
/// to deliver and the failed ones (see `outbox::report`), never the delivered history.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// What became of one claimed row, as counted in `relay_deliveries_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Users executed the effect now and the row is done.
    Linked,
    /// Users answered from its inbox (an earlier attempt had executed it); the row is done.
    Replayed,
    /// A transient failure; the row waits for its next attempt.
    Retried,
    /// Rejected, undeliverable or out of attempts; the row is `failed`.
    Failed,
    /// Handed back unsent (too little lease left, or stopping); no attempt was used.
    Released,
    /// Another relay had taken the row over; nothing was recorded.
    Superseded,
}

impl Outcome {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Linked => "linked",
            Self::Replayed => "replayed",
            Self::Retried => "retried",
            Self::Failed => "failed",
            Self::Released => "released",
            Self::Superseded => "superseded",
        }
    }
}

/// Counts one committed batch of finalizes by how it was recorded.
pub fn finalize_batch(path: BatchPath) {
    metrics::counter!(FINALIZE_BATCHES, "path" => path.label()).increment(1);
}

/// Gives each metric its help text; call once after the recorder is installed.
pub fn describe() {
    metrics::describe_counter!(
        FINALIZE_BATCHES,
        "Batches of answered rows recorded, by path: alone (one row), set (set-based: one statement on PostgreSQL, two on SQLite), row_by_row (a student refused its user)"
    );
    metrics::describe_counter!(
        DELIVERIES,
        "Outbox rows this relay handled, by effect and outcome"
    );
    metrics::describe_histogram!(
        USERS_CALL_SECONDS,
        metrics::Unit::Seconds,
        "Duration of each call to Users, whatever its answer"
    );
    metrics::describe_histogram!(
        LINK_LATENCY_SECONDS,
        metrics::Unit::Seconds,
        "From an outbox row's creation to its delivery being recorded (done)"
    );
    metrics::describe_gauge!(
        IN_FLIGHT_LIMIT,
        "Rows this relay may have in flight now: --concurrency, lowered while Users sheds calls"
    );
    metrics::describe_gauge!(
        WAKEUPS_LISTENING,
        "1 while commits wake this relay (PostgreSQL LISTEN, the SQLite watcher); 0 while only its poll does, until they are back"
    );
    metrics::describe_counter!(
        WAKEUP_LOSSES,
        "Times this relay was left polling only: its wake-ups lost (LISTEN connection ended or gone silent, SQLite watcher failing) or not set up at start; a connection the driver made again at once is not one"
    );
    // Exported at 0 from the start, so `increase()` sees the first loss.
    metrics::counter!(WAKEUP_LOSSES).increment(0);
    metrics::describe_counter!(
        WAKEUPS,
        "Times a commit woke this relay: a NOTIFY heard (PostgreSQL; several heard at once count once) or the SQLite file changed with rows pending"
    );
    metrics::counter!(WAKEUPS).increment(0);
    metrics::describe_gauge!(
        OUTBOX_ROWS,
        "Outbox rows by status, read from the Student DB (done: estimated on PostgreSQL)"
    );
    metrics::describe_gauge!(
        OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest row not yet delivered (0 when none)"
    );
}

/// Counts one handled row.
pub fn delivery(effect: &str, outcome: Outcome) {
    metrics::counter!(DELIVERIES, "effect" => effect.to_owned(), "outcome" => outcome.label())
        .increment(1);
}

/// Sets how many calls this relay may have in flight now.
pub fn in_flight_limit(limit: usize) {
    #[allow(clippy::cast_precision_loss)] // at most --concurrency, a u16
    metrics::gauge!(IN_FLIGHT_LIMIT).set(limit as f64);
}

/// Sets whether commits wake this relay now, or only its poll does.
pub fn wakeups_listening(listening: bool) {
    metrics::gauge!(WAKEUPS_LISTENING).set(if listening { 1.0 } else { 0.0 });
}

/// Counts one wake-up a commit gave this relay (see [`WAKEUPS`]).
pub fn woken_by_a_commit() {
    metrics::counter!(WAKEUPS).increment(1);
}

/// Counts one loss of this relay's wake-ups (see [`WAKEUP_LOSSES`]).
pub fn wakeup_lost() {
    metrics::counter!(WAKEUP_LOSSES).increment(1);
}

/// Times one call to Users.
pub fn users_call(elapsed: Duration) {
    metrics::histogram!(USERS_CALL_SECONDS).record(elapsed);
}

/// Records how long a row took from creation to done (by the database's clock for
/// `created_at`, this machine's for now; a skew shows as a shift, never a negative value).
pub fn link_latency(created_at: DateTime<Utc>) {
    let waited = (Utc::now() - created_at).to_std().unwrap_or_default();
    metrics::histogram!(LINK_LATENCY_SECONDS).record(waited);
}

/// Sets the outbox gauges from a report.
pub fn outbox_gauges(report: &OutboxReport) {
    let statuses = [
        ("pending", report.pending),
        ("processing", report.processing),
        ("done", report.done),
        ("failed", report.failed),
        ("blocked", report.blocked),
    ];
    for (status, rows) in statuses {
        #[allow(clippy::cast_precision_loss)] // row counts stay far below 2^52
        metrics::gauge!(OUTBOX_ROWS, "status" => status).set(rows as f64);
    }
    #[allow(clippy::cast_precision_loss)]
    metrics::gauge!(OLDEST_PENDING_AGE).set(report.oldest_pending_age_seconds as f64);
}

/// What the outbox gauges show: every status counted, but `done` estimated on PostgreSQL,
/// so that reading it every few seconds in every relay never scans the delivered history.
pub async fn gauge_report(db: &DatabaseConnection) -> Result<OutboxReport, sea_orm::DbErr> {
    outbox::report(db, DoneCount::Estimated).await
}

/// Reads the outbox gauges from the database every few seconds until `shutdown`.
pub async fn watch_outbox(db: DatabaseConnection, shutdown: CancellationToken) {
    loop {
        match gauge_report(&db).await {
            Ok(report) => outbox_gauges(&report),
            Err(err) => tracing::warn!(error = %err, "cannot read the outbox gauges"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(GAUGE_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    /// Each status's gauge shows that status's own count, never another's.
    #[test]
    fn each_outbox_status_gauge_shows_its_own_count() {
        let report = OutboxReport {
            pending: 1,
            processing: 2,
            done: 3,
            failed: 4,
            oldest_pending_age_seconds: 5,
            retrying: 6,
            blocked: 7,
        };
        let recorder = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || outbox_gauges(&report));
        let text = recorder.handle().render();
        for line in [
            "outbox_rows{status=\"pending\"} 1\n",
            "outbox_rows{status=\"processing\"} 2\n",
            "outbox_rows{status=\"done\"} 3\n",
            "outbox_rows{status=\"failed\"} 4\n",
            "outbox_rows{status=\"blocked\"} 7\n",
            "outbox_oldest_pending_age_seconds 5\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
