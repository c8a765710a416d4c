//! The relay: delivers the Student DB's outbox to the Users service. It reads `pending`
//! rows, calls `CreateUser` with each row's stored idempotency key (never holding a
//! transaction open across the call), then links the returned user to the student and
//! marks the row `done` in one Student-DB transaction. It also replays past deliveries
//! (`relay replay`) and reports the outbox (`relay status`).
//!
//! The relay is part of Student's side: it reads and writes the Student DB and talks to
//! Users only over gRPC.

mod backoff;
pub mod classify;
pub mod cli;
mod deliver;
pub mod replay;
pub mod retry_failed;
pub mod status;
pub mod store;
pub mod users_client;
pub mod wakeup;

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

pub use deliver::{BatchOutcome, Relay};

/// Tuning of `relay run`. The defaults drain a backlog within 45 s of the last crash (a
/// dead relay's rows are claimable again after one lease) and ride out a 10-minute Users
/// outage without failing a row (100 attempts, mostly 0–30 s apart; see the tests below).
#[derive(Debug, Clone, clap::Args)]
pub struct RunConfig {
    /// Pause between polls when idle (on PostgreSQL, NOTIFY usually wakes the relay first).
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// Rows claimed per batch.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_size: u16,
    /// Calls to Users in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// How long a claimed row stays reserved for this relay; after that another relay may
    /// claim it. Must exceed --call-timeout.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Deadline of each call to Users.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub call_timeout: Duration,
    /// Attempts before a row that keeps failing transiently is marked failed.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// First retry delay after a transient failure (doubles per attempt, full jitter).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,
}

impl RunConfig {
    /// Rejects tunings that break a guarantee.
    pub fn validate(&self) -> anyhow::Result<()> {
        // A call still running when its lease ends may overlap another relay's delivery of
        // the same row: harmless (the inbox answers both) but wasteful, and it makes a
        // relay's work outlive its claim. The deadline keeps every call inside the lease.
        anyhow::ensure!(
            self.call_timeout < self.lease,
            "--call-timeout ({:?}) must be shorter than --lease ({:?})",
            self.call_timeout,
            self.lease
        );
        Ok(())
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        <Self as clap::FromArgMatches>::from_arg_matches(
            &<Self as clap::Args>::augment_args(clap::Command::new("defaults"))
                .get_matches_from(["defaults"]),
        )
        .unwrap_or_else(|_| unreachable!("every run flag has a default"))
    }
}

/// Opens the Student DB once it is reachable and its schema is in place (student-svc
/// applies it), so the relay can start before the database and the service. Returns
/// `None` if `shutdown` came first.
pub async fn open_when_ready(
    url: &str,
    shutdown: &CancellationToken,
) -> Option<DatabaseConnection> {
    let mut logged = false;
    let mut connection = None;
    loop {
        if connection.is_none() {
            connection = platform::db::connect(url).await.ok();
        }
        let waiting_for = match &connection {
            Some(db) => match migrations::is_current::<migrations::student::Migrator>(db).await {
                Ok(true) => return connection,
                Ok(false) | Err(_) => "student-svc to create the Student DB schema",
            },
            None => "the Student DB to be reachable",
        };
        if !logged {
            tracing::info!("waiting for {waiting_for}");
            logged = true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_ride_out_a_ten_minute_users_outage() {
        let config = RunConfig::default();
        // A row fails for good at its max_attempts-th failure; before that it waits one
        // jittered delay after each failure. Simulate many rows: none may give up within
        // ten minutes (the margin is many standard deviations, so this never flakes).
        let shortest = (0..2_000)
            .map(|_| {
                (1..config.max_attempts)
                    .map(|attempt| {
                        backoff::retry_delay(attempt, config.backoff_base, config.backoff_max)
                    })
                    .sum::<Duration>()
            })
            .min()
            .unwrap_or_default();
        assert!(
            shortest > Duration::from_secs(15 * 60),
            "a row gave up after {shortest:?}"
        );
    }

    #[test]
    fn defaults_drain_a_backlog_within_45_seconds_of_the_last_crash() {
        let config = RunConfig::default();
        // A dead relay's rows are claimable once its lease runs out; a row backing off is
        // due again within backoff_max. Either way well inside 45 s.
        assert!(config.lease <= Duration::from_secs(15));
        assert!(config.backoff_max <= Duration::from_secs(30));
        assert!(config.call_timeout < config.lease);
        config.validate().expect("the defaults are valid");
    }

    #[test]
    fn a_deadline_longer_than_the_lease_is_refused() {
        let config = RunConfig {
            call_timeout: Duration::from_secs(20),
            ..RunConfig::default()
        };
        let err = config.validate().expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "--call-timeout (20s) must be shorter than --lease (15s)"
        );
    }
}
