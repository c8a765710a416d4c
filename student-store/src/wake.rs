//! How the writers of outbox rows wake the relays on PostgreSQL (relays `LISTEN` on
//! [`OUTBOX_CHANNEL`]; on SQLite there is no `NOTIFY`, and relays watch the file's
//! `data_version` instead: `relay/src/wakeup.rs`).
//!
//! A `NOTIFY` inside the writing transaction is the textbook way, but PostgreSQL commits
//! every notifying transaction under one database-wide lock, held through the WAL flush:
//! concurrent CreateStudents then commit one disk sync at a time instead of sharing one
//! (measured in BENCHMARKS.md: about half the commits per second at 32 in flight). So by
//! default the bell rings after the commit, from a task of its own: rings that arrive while
//! one `NOTIFY` is on its way become one more, so a burst of commits costs one or two.
//!
//! Either way the bell is only a hint. A relay claims what the database says is due, and
//! polls too: a ring lost to a crash between commit and `NOTIFY` delays the row by at most
//! the relay's poll interval, and never loses it.

use std::str::FromStr;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr};
use tokio::sync::mpsc;

use crate::OUTBOX_CHANNEL;

/// When a new outbox row wakes the relays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WakeRelays {
    /// `NOTIFY` right after the commit, coalesced (the default).
    #[default]
    AfterCommit,
    /// `NOTIFY` inside the transaction that writes the row (commits serialise on it).
    InTransaction,
    /// No `NOTIFY`: relays find rows at their next poll.
    Off,
}

impl FromStr for WakeRelays {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "after-commit" => Ok(Self::AfterCommit),
            "in-transaction" => Ok(Self::InTransaction),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "unknown wake-up {other:?}: expected after-commit, in-transaction or off"
            )),
        }
    }
}

/// Rings for the relays when outbox rows commit. Cheap to clone; the ringing task ends
/// when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct RelayBell {
    mode: WakeRelays,
    /// After-commit rings, to the ringing task; capacity one, so a full queue means a
    /// `NOTIFY` is already due and this ring is part of it.
    rings: Option<mpsc::Sender<()>>,
}

impl RelayBell {
    /// A bell for the database `db`. On PostgreSQL with [`WakeRelays::AfterCommit`] it
    /// starts the ringing task (call it inside a Tokio runtime); on SQLite it never rings.
    pub fn new(db: &DatabaseConnection, mode: WakeRelays) -> Self {
        let rings = (db.get_database_backend() == DbBackend::Postgres
            && mode == WakeRelays::AfterCommit)
            .then(|| {
                let (rings, pending) = mpsc::channel(1);
                tokio::spawn(ring(db.clone(), pending));
                rings
            });
        Self { mode, rings }
    }

    /// A bell that never rings: relays rely on their poll.
    pub fn silent() -> Self {
        Self {
            mode: WakeRelays::Off,
            rings: None,
        }
    }

    /// Whether this bell `NOTIFY`s inside the writing transaction (on PostgreSQL), which
    /// then needs a transaction of its own.
    pub(crate) fn rings_in_transaction(&self) -> bool {
        self.mode == WakeRelays::InTransaction
    }

    /// Inside the writing transaction: `NOTIFY` there if that is the mode (PostgreSQL
    /// delivers it at commit, never for a rolled-back row).
    pub(crate) async fn in_transaction(&self, txn: &impl ConnectionTrait) -> Result<(), DbErr> {
        if self.mode == WakeRelays::InTransaction
            && txn.get_database_backend() == DbBackend::Postgres
        {
            txn.execute_unprepared(&format!("NOTIFY {OUTBOX_CHANNEL}"))
                .await?;
        }
        Ok(())
    }

    /// After the writing transaction committed: ring if that is the mode. Never waits.
    pub(crate) fn after_commit(&self) {
        if let Some(rings) = &self.rings {
            // Full: a ring is already waiting to be sent, and covers this commit too.
            let _ = rings.try_send(());
        }
    }
}

/// Sends one `NOTIFY` per ring, until every bell is dropped.
async fn ring(db: DatabaseConnection, mut pending: mpsc::Receiver<()>) {
    let notify = format!("NOTIFY {OUTBOX_CHANNEL}");
    while pending.recv().await.is_some() {
        if let Err(err) = db.execute_unprepared(&notify).await {
            // The relays poll: the rows are claimed at their next tick.
            tracing::warn!(error = %err, "cannot NOTIFY the relays; they will poll");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each wake-up mode is spelled one way and parses to itself; anything else is refused.
    #[test]
    fn each_wake_up_parses_to_its_own_mode() {
        assert_eq!("after-commit".parse(), Ok(WakeRelays::AfterCommit));
        assert_eq!("in-transaction".parse(), Ok(WakeRelays::InTransaction));
        assert_eq!("off".parse(), Ok(WakeRelays::Off));
        assert_eq!(
            "sometimes".parse::<WakeRelays>(),
            Err(
                "unknown wake-up \"sometimes\": expected after-commit, in-transaction or off"
                    .into()
            )
        );
    }
}
