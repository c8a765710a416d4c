//! The delivery loop: calls to Users kept in flight continuously, not batch by batch.
//!
//! The relay claims rows as slots (rows in flight) free up (never more rows than free
//! slots, so every claimed row is sent at once, inside its lease), and claims again at once
//! after a full claim, when a row is notified (PostgreSQL `NOTIFY`, kept if it arrives while
//! busy), or when the poll interval passes. A slow call holds its rows' slots, never the
//! next claim.
//!
//! Each call (one row, or the rows of one CreateUsers call) is delivered on a task of its
//! own: its call and its rows' finalize progress
//! whatever the loop is doing. (Were they futures the loop polls only between its own
//! awaits, a finalize holding SQLite's write lock could wait for the loop while the loop's
//! next claim waits for that lock.)

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use student_store::{entity::outbox as outbox_row, outbox::Claim};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    Relay, backoff::exponential_ceiling, deliver::Delivery, finalize::Finalizer, metrics::Outcome,
    wakeup::Wakeup,
};

/// The deliveries a relay has in flight: each call (one row, or the rows of one
/// CreateUsers call) on a task of its own, and how many rows that is.
#[derive(Default)]
struct InFlight {
    calls: JoinSet<Vec<anyhow::Result<(Delivery, i64)>>>,
    rows_of: HashMap<tokio::task::Id, usize>,
    rows: usize,
}

/// What a finished call's task gave back: one result per row, or the task's failure.
type Finished = Result<Vec<anyhow::Result<(Delivery, i64)>>, tokio::task::JoinError>;

impl InFlight {
    fn spawn(&mut self, relay: Relay, rows: Vec<outbox_row::Model>, lease_ends: Instant) {
        let count = rows.len();
        let task = self
            .calls
            .spawn(async move { relay.send_rows_within_lease(rows, lease_ends).await });
        self.rows_of.insert(task.id(), count);
        self.rows += count;
    }

    fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The next call to finish (pending forever when none is in flight).
    async fn next(&mut self) -> Option<Finished> {
        let (id, finished) = match self.calls.join_next_with_id().await? {
            Ok((id, results)) => (id, Ok(results)),
            Err(err) => (err.id(), Err(err)),
        };
        self.rows -= self.rows_of.remove(&id).unwrap_or(0);
        Some(finished)
    }
}

impl Relay {
    /// Delivers rows until `shutdown` is cancelled (the rows of a claim it interrupts go
    /// back unsent), then lets the calls in flight finish (each within its deadline; a call
    /// Users sheds is not sent again, its row goes back) and records them. Errors of the database make the loop back off, growing, so they never
    /// spin.
    pub async fn run(&self, wakeup: Wakeup, shutdown: CancellationToken) {
        // Deliveries record their rows through one group-committing finalizer; each waits
        // for its record, so once the loop has drained nothing is left to record.
        let this = Relay {
            finalizer: Some(Finalizer::start(self.db.clone(), self.id.clone())),
            stopping: shutdown.clone(),
            ..self.clone()
        };
        this.deliver_until(wakeup, shutdown).await;
        tracing::info!(relay = %self.id, "relay stopped");
    }

    async fn deliver_until(&self, wakeup: Wakeup, shutdown: CancellationToken) {
        let mut in_flight = InFlight::default();
        let mut due = true;
        let mut consecutive_errors = 0u32;
        let mut reported_limit = None;
        while !shutdown.is_cancelled() {
            // Up to --concurrency rows, fewer while Users sheds calls (see `budget.rs`).
            let concurrency = self.budget.limit();
            if reported_limit != Some(concurrency) {
                crate::metrics::in_flight_limit(concurrency);
                reported_limit = Some(concurrency);
            }
            // Claim again once this many slots are free, rather than one row at a time: a
            // claim is a transaction, and small ones cost more than they gain.
            let refill = (concurrency / 4).max(1);
            let free = concurrency.saturating_sub(in_flight.rows);
            if due && (free >= refill || in_flight.is_empty()) {
                let limit = free.min(usize::from(self.config.batch_size));
                match self.claim(u32::try_from(limit).unwrap_or(u32::MAX)).await {
                    Ok((rows, lease_ends)) => {
                        consecutive_errors = 0;
                        // Stopped while the claim ran: send none of its rows. They go back
                        // at once, for another relay to take now rather than after a call.
                        if shutdown.is_cancelled() {
                            for row in &rows {
                                crate::metrics::delivery(&row.effect_type, Outcome::Released);
                            }
                            let claims: Vec<_> = rows.iter().map(Claim::from).collect();
                            self.give_back(&claims).await;
                            break;
                        }
                        // A full claim: more rows are probably due.
                        due = rows.len() == limit;
                        for call in self.calls_of(rows) {
                            in_flight.spawn(self.clone(), call, lease_ends);
                        }
                        if due && in_flight.rows < concurrency {
                            continue;
                        }
                    }
                    Err(err) => {
                        consecutive_errors += 1;
                        let pause = exponential_ceiling(
                            consecutive_errors,
                            self.config.poll_interval,
                            self.config.backoff_max,
                        );
                        tracing::warn!(error = format!("{err:#}"), retry_in = ?pause, "claim failed");
                        self.wait(&mut in_flight, pause, &shutdown).await;
                        continue;
                    }
                }
            }
            tokio::select! {
                Some(finished) = in_flight.next(), if !in_flight.is_empty() => {
                    self.finished(finished).await;
                }
                () = wakeup.notified() => due = true,
                () = tokio::time::sleep(self.config.poll_interval) => due = true,
                () = shutdown.cancelled() => {}
            }
        }
        // Stopping: no new claims; what is in flight finishes and is recorded.
        while let Some(finished) = in_flight.next().await {
            self.finished(finished).await;
        }
    }

    /// Waits `pause`, handling deliveries that finish meanwhile.
    async fn wait(&self, in_flight: &mut InFlight, pause: Duration, shutdown: &CancellationToken) {
        let sleep = tokio::time::sleep(pause);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                Some(finished) = in_flight.next(), if !in_flight.is_empty() => {
                    self.finished(finished).await;
                }
                () = &mut sleep => return,
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Handles the rows of one finished call: a row that was not sent goes back at once; a
    /// row whose outcome could not be recorded keeps its lease and is claimed again once it
    /// runs out.
    async fn finished(&self, finished: Finished) {
        let results = match finished {
            Ok(results) => results,
            Err(err) => {
                tracing::error!(error = %err, "a delivery task failed");
                return;
            }
        };
        let mut unsent = Vec::new();
        for result in results {
            match result {
                Ok((Delivery::Unsent(claim), _)) => unsent.push(claim),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(
                        error = format!("{err:#}"),
                        "cannot record a delivery; the row will be claimed again after its lease"
                    );
                }
            }
        }
        self.give_back(&unsent).await;
    }

    /// [`Relay::release_unsent`], where a failure only delays the rows: they are claimable
    /// again once their lease runs out.
    async fn give_back(&self, unsent: &[Claim]) {
        if let Err(err) = self.release_unsent(unsent).await {
            tracing::warn!(rows = ?unsent, error = format!("{err:#}"), "cannot release unsent rows; their leases will run out");
        }
    }
}
