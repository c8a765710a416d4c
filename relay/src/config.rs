//! The tuning of `relay run`: every flag with a `RELAY_*` environment variable and a
//! default, and the checks that refuse a tuning that would break a guarantee.

use std::{net::SocketAddr, time::Duration};

/// The least time a claimed row may wait for its send before it would rather be released
/// than sent (see [`RunConfig::validate`]).
const MIN_SEND_MARGIN: Duration = Duration::from_millis(250);

/// Tuning of `relay run`. With the defaults, the rows of a relay that died are claimable
/// again once its lease (15 s) runs out and a row backing off is due again within 30 s, and
/// a 10-minute Users outage fails no row (100 attempts, mostly 0–30 s apart; see the tests
/// below).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RunConfig {
    /// Pause between polls when idle (on PostgreSQL, NOTIFY usually wakes the relay first).
    #[arg(long, env = "RELAY_POLL_INTERVAL", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// Most rows claimed at once (never more than --concurrency: every claimed row is sent
    /// at once).
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_size: u16,
    /// Rows in flight at once (in calls of their own or in CreateUsers calls, see
    /// --rows-per-call). A claim takes at most this many rows, so every claimed row is sent
    /// at once. Each row spends most of its time waiting (on Users, on
    /// a commit), so more in flight means more throughput until a database is saturated
    /// (BENCHMARKS.md); keep the calls this makes (create-user rows --rows-per-call to a
    /// call, each change in a call of its own), summed over all relays, within users-svc's
    /// --max-concurrent-requests (512), or the excess is shed and retried.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Most `create-user` rows sent to Users in one CreateUsers call (one Users transaction
    /// for the rows it executes, instead of one call and one transaction per row). 1 sends
    /// every row in a CreateUser call of its own. At most 100 (Users' limit).
    #[arg(long, env = "RELAY_ROWS_PER_CALL", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub rows_per_call: u16,
    /// How long a claimed row stays reserved for this relay; after that another relay may
    /// claim it. At least --call-timeout plus half of it (and plus 250ms at least).
    #[arg(long, env = "RELAY_LEASE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Deadline of each call to Users.
    #[arg(long, env = "RELAY_CALL_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub call_timeout: Duration,
    /// Attempts before a row that keeps failing transiently is marked failed.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// First retry delay after a transient failure (doubles per attempt, full jitter).
    #[arg(long, env = "RELAY_BACKOFF_BASE", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[arg(long, env = "RELAY_BACKOFF_MAX", default_value = "30s", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics (off when unset; port 0 picks one).
    #[arg(long, env = "RELAY_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// How often `relay run` deletes done rows past --retain-done (as `relay purge` does).
    #[arg(long, env = "RELAY_PURGE_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,
}

impl RunConfig {
    /// The tuning of a bare `relay` (no subcommand): the defaults, overridden by any
    /// `RELAY_*` variable that is set.
    pub fn from_env() -> Result<Self, clap::Error> {
        let command = <Self as clap::Args>::augment_args(clap::Command::new("run"));
        <Self as clap::FromArgMatches>::from_arg_matches(&command.try_get_matches_from(["run"])?)
    }

    /// Rejects tunings that break a guarantee.
    ///
    /// The worst case of one delivery: the row is claimed (its lease starts), its call
    /// starts at once (a claim never takes more rows than there are free call slots) and
    /// ends within --call-timeout (the deadline travels with the call, so Users gives up
    /// too). A call that could not end before the lease does is never started: the row is
    /// released instead, since another relay may claim it the moment the lease ends. The
    /// margin between the two covers the claim's own round trip and a slow database, so
    /// that releasing stays the exception.
    pub fn validate(&self) -> anyhow::Result<()> {
        let margin = (self.call_timeout / 2).max(MIN_SEND_MARGIN);
        anyhow::ensure!(
            self.lease >= self.call_timeout + margin,
            "--lease ({:?}) must be at least --call-timeout ({:?}) plus {:?}, so that a call \
             started right after its claim ends well inside the lease",
            self.lease,
            self.call_timeout,
            margin
        );
        anyhow::ensure!(
            self.backoff_base <= self.backoff_max,
            "--backoff-base ({:?}) must not exceed --backoff-max ({:?})",
            self.backoff_base,
            self.backoff_max
        );
        Ok(())
    }
}

impl Default for RunConfig {
    /// The defaults `relay run --help` shows (a test holds the two together).
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(250),
            batch_size: 64,
            concurrency: 128,
            rows_per_call: 16,
            lease: Duration::from_secs(15),
            call_timeout: Duration::from_secs(5),
            max_attempts: 100,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            metrics_addr: None,
            purge_interval: Duration::from_secs(3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff;

    #[test]
    fn users_is_told_the_retry_window_these_defaults_give() {
        let defaults = RunConfig::default();
        let longest_wait = defaults.backoff_max + defaults.call_timeout;
        assert_eq!(
            longest_wait * defaults.max_attempts,
            platform::retention::RELAY_DEFAULT_RETRY_WINDOW
        );
    }

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
    fn the_default_impl_matches_the_flag_defaults() {
        // (Unless a RELAY_* variable is set where the tests run.)
        let parsed = RunConfig::from_env().expect("every flag has a default");
        assert_eq!(parsed, RunConfig::default());
    }

    #[test]
    fn defaults_make_every_row_due_again_within_45_seconds_of_the_last_crash() {
        let config = RunConfig::default();
        // A dead relay's rows are claimable once its lease runs out; a row backing off is
        // due again within backoff_max.
        assert_eq!(config.lease, Duration::from_secs(15));
        assert_eq!(config.backoff_max, Duration::from_secs(30));
        config.validate().expect("the defaults are valid");
    }

    #[test]
    fn a_lease_that_cannot_cover_a_call_is_refused() {
        let config = RunConfig {
            call_timeout: Duration::from_secs(12),
            ..RunConfig::default()
        };
        let err = config.validate().expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "--lease (15s) must be at least --call-timeout (12s) plus 6s, so that a call \
             started right after its claim ends well inside the lease"
        );
        let tight = RunConfig {
            lease: Duration::from_millis(600),
            call_timeout: Duration::from_millis(400),
            ..RunConfig::default()
        };
        assert!(tight.validate().is_err(), "250ms of margin at least");
        let fits = RunConfig {
            lease: Duration::from_millis(650),
            ..tight
        };
        fits.validate().expect("400ms + 250ms fits");
    }

    /// A backoff whose first delay already is the longest (no growth) is a valid tuning;
    /// a first delay beyond the longest is refused.
    #[test]
    fn a_backoff_base_equal_to_the_max_is_valid_and_one_above_it_is_refused() {
        let flat = RunConfig {
            backoff_base: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30),
            ..RunConfig::default()
        };
        flat.validate().expect("base == max is valid");
        let inverted = RunConfig {
            backoff_base: Duration::from_secs(31),
            ..flat
        };
        let err = inverted.validate().expect_err("base > max");
        assert_eq!(
            err.to_string(),
            "--backoff-base (31s) must not exceed --backoff-max (30s)"
        );
    }

    /// `relay run --rows-per-call` accepts at most 100 rows per call (Users' limit for one
    /// CreateUsers call) and at least 1.
    #[test]
    fn rows_per_call_accepts_one_to_a_hundred_and_nothing_else() {
        use clap::Parser as _;
        let parse = |rows: &str| {
            crate::cli::Cli::try_parse_from(["relay", "run", "--rows-per-call", rows])
                .map(|cli| cli.command)
        };
        for accepted in [1_u16, 100] {
            let command = parse(&accepted.to_string()).expect("within 1..=100");
            let Some(crate::cli::Command::Run(config)) = command else {
                panic!("`relay run` parsed as {command:?}");
            };
            assert_eq!(config.rows_per_call, accepted);
        }
        for refused in ["101", "0", "1000"] {
            let err = parse(refused).expect_err("outside 1..=100");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{refused}: {err}"
            );
        }
    }

    /// Counts of zero would break the loop: no rows claimed (and claimed again at once, a
    /// "full" claim of none), no call slot, or every transient error a failed row.
    #[test]
    fn counts_of_zero_are_refused() {
        use clap::Parser as _;
        for flag in ["--batch-size", "--concurrency", "--max-attempts"] {
            let err = crate::cli::Cli::try_parse_from(["relay", "run", flag, "0"])
                .expect_err("zero refused");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag}: {err}"
            );
            let accepted = crate::cli::Cli::try_parse_from(["relay", "run", flag, "1"]);
            assert!(accepted.is_ok(), "{flag} 1: {accepted:?}");
        }
    }
}
