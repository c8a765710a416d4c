//! Named fail points for crash tests, compiled in only with the `failpoints` feature.
//!
//! A test starts a binary with `FAILPOINTS="name=action;name2=action"`, where an action is
//! `abort` (the process dies at once, with no cleanup: a crash), `panic` (the task
//! panics: a bug there, the process going on), `sleep(MS)` (the task waits), `error` (the step the point stands for fails, where the code asks with
//! [`fails`]), or any of them prefixed by `N*` to act on the first N hits only (`1*abort`). One
//! entry is not a point but a setting: `clock-skew=skew(MS)` moves the process's clock
//! ([`clock_skew`]) by MS milliseconds (negative: behind), to test that nothing compares
//! one machine's clock with another's. Without the feature, [`hit`] compiles to nothing
//! and the clock is never skewed.

/// Fail points in the binaries. Each names the moment it stands for.
pub mod points {
    /// student-svc, CreateStudent: both rows written, transaction not yet committed. On
    /// PostgreSQL, where both rows are one statement (unless the `NOTIFY` is in the
    /// transaction), nothing is sent yet: there is no moment with uncommitted rows.
    pub const STUDENT_BEFORE_COMMIT: &str = "student-before-commit";
    /// student-svc, CreateStudent's group commit: several students written together (see
    /// `student_store::students::create_many`), not yet committed; hit after
    /// [`STUDENT_BEFORE_COMMIT`], and only for a group of two or more.
    pub const STUDENT_BEFORE_GROUP_COMMIT: &str = "student-before-group-commit";
    /// student-svc, CreateStudent: committed, answer not yet sent.
    pub const STUDENT_AFTER_COMMIT: &str = "student-after-commit";
    /// student-svc, UpdateStudent or DeactivateStudent: the new version and its outbox row
    /// written, transaction not yet committed.
    pub const STUDENT_CHANGE_BEFORE_COMMIT: &str = "student-change-before-commit";
    /// relay: rows claimed (leased), Users not yet called.
    pub const RELAY_AFTER_CLAIM: &str = "relay-after-claim";
    /// relay: Users answered, the link and `done` not yet recorded.
    pub const RELAY_BEFORE_FINALIZE: &str = "relay-before-finalize";
    /// relay on SQLite, a batch of answers recorded set-based: its rows marked `done`,
    /// their students not yet linked, the transaction not committed. (PostgreSQL records
    /// such a batch in one statement: there is no such point.)
    pub const RELAY_BETWEEN_FINISH_STATEMENTS: &str = "relay-between-finish-statements";
    /// relay, `error` only: setting up its wake-ups at start fails (PostgreSQL: connecting
    /// and `LISTEN`ing; SQLite: opening the watcher and reading its first `data_version`).
    pub const RELAY_WAKEUPS_START: &str = "relay-wakeups-start";
    /// relay, `error` only: its running wake-ups are lost (PostgreSQL: waiting for a
    /// notification fails, as when the connection drops and cannot be made again; SQLite:
    /// a read of `data_version` fails). Hit each time the listener or watcher looks.
    pub const RELAY_WAKEUPS_LOST: &str = "relay-wakeups-lost";
    /// relay, `error` only: a try to get lost wake-ups back fails, as while the database
    /// is unreachable.
    pub const RELAY_WAKEUPS_RETRY: &str = "relay-wakeups-retry";
    /// users-svc, a write (CreateUser, CreateUsers, UpdateUser, DisableUser): the request
    /// arrived; nothing read, written or locked yet (a `sleep` here makes Users slow
    /// without holding any database lock).
    pub const USERS_ON_REQUEST: &str = "users-on-request";
    /// users-svc, a write: its rows written, transaction not yet committed. For CreateUser
    /// on PostgreSQL (one statement) nothing is sent yet; UpdateUser and DisableUser keep
    /// their transaction everywhere.
    pub const USERS_BEFORE_COMMIT: &str = "users-before-commit";
    /// users-svc, a write: committed, answer not yet sent.
    pub const USERS_AFTER_COMMIT: &str = "users-after-commit";
}

/// Triggers the fail point `name` if the `FAILPOINTS` environment variable arms it.
#[cfg(feature = "failpoints")]
pub async fn hit(name: &str) {
    if let Some(action) = armed::take(name) {
        match action {
            armed::Action::Abort => {
                tracing::warn!(failpoint = name, "fail point: aborting the process");
                std::process::abort();
            }
            armed::Action::Panic => {
                tracing::warn!(failpoint = name, "fail point: panicking");
                panic!("fail point {name}");
            }
            armed::Action::Sleep(duration) => {
                tracing::warn!(failpoint = name, ?duration, "fail point: sleeping");
                tokio::time::sleep(duration).await;
            }
            armed::Action::Skew(_) | armed::Action::Error => {}
        }
    }
}

/// Whether the step the fail point `name` stands for should fail now: `FAILPOINTS` arms it
/// with `error` (each call is a hit).
#[cfg(feature = "failpoints")]
pub fn fails(name: &str) -> bool {
    let fails = armed::take(name) == Some(armed::Action::Error);
    if fails {
        tracing::warn!(failpoint = name, "fail point: failing");
    }
    fails
}

/// Whether the step the fail point `name` stands for should fail now: never (the
/// `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fails(_name: &str) -> bool {
    false
}

/// Triggers the fail point `name` (compiled out: the `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn hit(_name: &str) {}

/// The entry that skews the clock: `clock-skew=skew(MS)`.
#[cfg(feature = "failpoints")]
const CLOCK_SKEW: &str = "clock-skew";

/// How far this process's clock is skewed for a test (`clock-skew=skew(MS)`); zero unless
/// armed.
#[cfg(feature = "failpoints")]
pub fn clock_skew() -> chrono::TimeDelta {
    match armed::take(CLOCK_SKEW) {
        Some(armed::Action::Skew(millis)) => chrono::TimeDelta::milliseconds(millis),
        _ => chrono::TimeDelta::zero(),
    }
}

/// How far this process's clock is skewed: never (the `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn clock_skew() -> chrono::TimeDelta {
    chrono::TimeDelta::zero()
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::{collections::HashMap, sync::Mutex, time::Duration};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        Abort,
        /// The task panics: a bug at that point, not a crash of the process.
        Panic,
        Sleep(Duration),
        /// The step fails; see [`super::fails`].
        Error,
        /// Only for `clock-skew`: milliseconds added to the clock.
        Skew(i64),
    }

    struct Armed {
        action: Action,
        /// Hits left before the point turns off; `None` acts forever.
        remaining: Option<u32>,
    }

    static POINTS: Mutex<Option<HashMap<String, Armed>>> = Mutex::new(None);

    /// Returns the action for this hit of `name`, counting it.
    pub fn take(name: &str) -> Option<Action> {
        let mut points = POINTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let points =
            points.get_or_insert_with(|| parse(&std::env::var("FAILPOINTS").unwrap_or_default()));
        let armed = points.get_mut(name)?;
        match &mut armed.remaining {
            Some(0) => None,
            Some(left) => {
                *left -= 1;
                Some(armed.action)
            }
            None => Some(armed.action),
        }
    }

    fn parse(spec: &str) -> HashMap<String, Armed> {
        spec.split(';')
            .filter_map(|entry| {
                let (name, action) = entry.trim().split_once('=')?;
                let (remaining, action) = match action.split_once('*') {
                    Some((count, action)) => (Some(count.parse().ok()?), action),
                    None => (None, action),
                };
                let action = match action {
                    "abort" => Action::Abort,
                    "panic" => Action::Panic,
                    "error" => Action::Error,
                    other => {
                        let (verb, argument) = other.strip_suffix(')')?.split_once('(')?;
                        match verb {
                            "sleep" => Action::Sleep(Duration::from_millis(argument.parse().ok()?)),
                            "skew" => Action::Skew(argument.parse().ok()?),
                            _ => return None,
                        }
                    }
                };
                Some((name.to_owned(), Armed { action, remaining }))
            })
            .collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn specs_parse_into_counted_actions() {
            let points = parse(
                "a=abort; b=2*sleep(150);bad;c=explode;clock-skew=skew(-3600000);d=3*error;e=1*panic",
            );
            assert_eq!(points["a"].action, Action::Abort);
            assert_eq!(points["a"].remaining, None);
            assert_eq!(
                points["b"].action,
                Action::Sleep(Duration::from_millis(150))
            );
            assert_eq!(points["b"].remaining, Some(2));
            assert!(!points.contains_key("bad") && !points.contains_key("c"));
            assert_eq!(points["clock-skew"].action, Action::Skew(-3_600_000));
            assert_eq!(points["d"].action, Action::Error);
            assert_eq!(points["d"].remaining, Some(3));
            assert_eq!(
                (points["e"].action, points["e"].remaining),
                (Action::Panic, Some(1))
            );
        }
    }
}
