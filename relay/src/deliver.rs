//! One row's delivery: claim due outbox rows, send each to Users with its stored key,
//! record the answer (the continuous loop around it is `pipeline.rs`). Delivery is
//! at-least-once; Users' inbox makes the effect exactly-once.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use platform::{
    failpoint::{self, points},
    otlp::ExportedSpan,
    status::code_name,
    trace::TraceContext,
};
use sea_orm::DatabaseConnection;
use student_store::{
    effect::{Effect, Operation},
    entity::outbox::{self as outbox_row, FailureKind},
    outbox::{self, Delivered, Problem, RecordError},
    students,
};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::{
    RunConfig,
    backoff::retry_delay,
    budget::CallBudget,
    classify::{Failure, classify, permanent_failure_kind},
    metrics::{self, Outcome},
    users_client::{self, Key, UsersClient, delivery_span, row_trace},
};

/// What one [`Relay::deliver_batch`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows delivered and linked.
    pub delivered: usize,
    /// Rows given back for a later attempt.
    pub retried: usize,
    /// Rows marked `failed`.
    pub failed: usize,
    /// Rows handed back unsent: the relay is shutting down, or too little of the lease was
    /// left to send them.
    pub released: usize,
    /// Rows whose outcome was not recorded because this relay no longer held them (its
    /// lease ran out and another relay took over, or the row was failed or re-keyed).
    pub superseded: usize,
}

/// The relay: a Student DB, a Users client, its tuning and its identity in leases.
/// Cheap to clone (the database pool and the channel are shared), so each delivery can
/// run on a task of its own.
#[derive(Clone)]
pub struct Relay {
    pub db: DatabaseConnection,
    pub users: UsersClient,
    pub config: RunConfig,
    /// Written to `locked_by`: which relay holds a row.
    pub id: String,
    /// Inside [`Relay::run`]: where answered rows go to be recorded together (see
    /// `finalize.rs`). `None`: each row is recorded on its own.
    pub(crate) finalizer: Option<crate::finalize::Finalizer>,
    /// How many rows may be in flight now: up to `config.concurrency`, fewer while Users
    /// sheds calls (see `budget.rs`).
    pub(crate) budget: Arc<CallBudget>,
    /// Set once Users turned out not to serve CreateUsers (an older Users): every row is
    /// then sent in a call of its own (see `deliver_many.rs`).
    pub(crate) one_row_per_call: Arc<AtomicBool>,
    /// Cancelled when [`Relay::run`] is told to stop: a call Users shed is then not sent
    /// again, and its row goes back (see [`Relay::call_until_answered`]).
    pub(crate) stopping: CancellationToken,
}

impl Relay {
    /// Creates a relay with a fresh identity (`relay-<pid>-<random>`).
    pub fn new(db: DatabaseConnection, users: UsersClient, config: RunConfig) -> Self {
        let random = Uuid::new_v4().simple().to_string();
        Self {
            db,
            users,
            id: format!("relay-{}-{}", std::process::id(), &random[..8]),
            finalizer: None,
            budget: Arc::new(CallBudget::new(usize::from(config.concurrency))),
            one_row_per_call: Arc::new(AtomicBool::new(false)),
            stopping: CancellationToken::new(),
            config,
        }
    }

    /// Claims one batch of due rows and delivers them, all at once, then returns: one step,
    /// for tests and tools to drive. [`Relay::run`] is the continuous loop.
    pub async fn deliver_batch(&self) -> anyhow::Result<BatchOutcome> {
        let (rows, lease_ends) = self.claim(self.claim_size()).await?;
        let mut outcome = BatchOutcome {
            claimed: rows.len(),
            ..BatchOutcome::default()
        };
        let results: Vec<_> = futures::stream::iter(self.calls_of(rows))
            .map(|rows| self.send_rows_within_lease(rows, lease_ends))
            .buffer_unordered(usize::from(self.config.concurrency))
            .flat_map(futures::stream::iter)
            .collect()
            .await;
        let mut unsent = Vec::new();
        let mut first_error = None;
        for result in results {
            match result {
                Ok((Delivery::Delivered { .. }, _)) => outcome.delivered += 1,
                Ok((Delivery::Retried, _)) => outcome.retried += 1,
                Ok((Delivery::Failed, _)) => outcome.failed += 1,
                Ok((Delivery::Superseded, _)) => outcome.superseded += 1,
                Ok((Delivery::Shed, _)) => outcome.released += 1,
                Ok((Delivery::Unsent(claim), _)) => unsent.push(claim),
                // A row whose outcome could not be recorded keeps its lease; it is claimed
                // again when the lease runs out.
                Err(err) => first_error = first_error.or(Some(err)),
            }
        }
        outcome.released += self.release_unsent(&unsent).await?;
        match first_error {
            Some(err) => Err(err),
            None => Ok(outcome),
        }
    }

    /// Hands rows this relay claimed but did not send back to `pending`, their attempt
    /// unused, for another relay to take at once; returns how many went back.
    pub(crate) async fn release_unsent(&self, unsent: &[outbox::Claim]) -> anyhow::Result<usize> {
        if unsent.is_empty() {
            return Ok(0);
        }
        let released =
            usize::try_from(outbox::release(&self.db, unsent, &self.id).await?).unwrap_or(0);
        tracing::info!(released, "released unsent rows for other relays");
        Ok(released)
    }

    /// Whether a call started now ends (within --call-timeout) before `lease_ends`. Never
    /// start a send the lease cannot cover: if the call could still be running when the
    /// lease ends, another relay could claim and send the row at the same time, burning an
    /// attempt. The row is given back instead ([`Relay::unsent_for_its_lease`]).
    pub(crate) fn lease_covers_a_call(&self, lease_ends: Instant) -> bool {
        Instant::now() + self.config.call_timeout < lease_ends
    }

    /// Whether a call may start now, and if not how its rows go back unsent: never once the
    /// relay is stopping (a stop waits for the calls in flight, never for new ones, such as
    /// the one-row calls of a CreateUsers call refused whole), nor when the lease could end
    /// before the call does.
    pub(crate) fn hand_back_unsent(&self, lease_ends: Instant) -> Option<HandBack> {
        if self.stopping.is_cancelled() {
            Some(Self::unsent_while_stopping)
        } else if !self.lease_covers_a_call(lease_ends) {
            Some(Self::unsent_for_its_lease)
        } else {
            None
        }
    }

    /// `row` not sent because its lease is too short: logged, counted `released`, and
    /// answered unsent, so that it goes back to `pending` at once.
    pub(crate) fn unsent_for_its_lease(row: &outbox_row::Model) -> (Delivery, i64) {
        tracing::warn!(
            outbox_id = row.id,
            "lease too short to send before it ends; releasing the row"
        );
        Self::handed_back(row)
    }

    /// `row` not sent (again) because the relay is stopping: answered unsent, so that it
    /// goes back to `pending` at once, for a relay that is not stopping.
    pub(crate) fn unsent_while_stopping(row: &outbox_row::Model) -> (Delivery, i64) {
        tracing::info!(
            outbox_id = row.id,
            "relay stopping; releasing the row unsent"
        );
        Self::handed_back(row)
    }

    fn handed_back(row: &outbox_row::Model) -> (Delivery, i64) {
        metrics::delivery(&row.effect_type, Outcome::Released);
        (Delivery::Unsent(outbox::Claim::from(row)), row.id)
    }

    /// How many rows one claim takes: no more than can be sent at once. A row claimed
    /// beyond the free call slots would wait for one while its lease runs, and could be
    /// sent after the lease ran out, when another relay may already be sending it.
    pub fn claim_size(&self) -> u32 {
        u32::from(self.config.batch_size.min(self.config.concurrency))
    }

    /// Splits claimed rows into the groups sent together (see `deliver_many.rs`).
    pub(crate) fn calls_of(&self, rows: Vec<outbox_row::Model>) -> Vec<Vec<outbox_row::Model>> {
        calls_of(rows, usize::from(self.config.rows_per_call))
    }

    /// Claims up to `limit` due rows; returns them with the moment their lease ends as this
    /// relay counts it (measured before the claim is sent, so never later than the lease
    /// the database records).
    pub(crate) async fn claim(
        &self,
        limit: u32,
    ) -> anyhow::Result<(Vec<outbox_row::Model>, Instant)> {
        let lease_ends = Instant::now() + self.config.lease;
        let rows = outbox::claim_batch(&self.db, &self.id, limit, self.config.lease).await?;
        if !rows.is_empty() {
            failpoint::hit(points::RELAY_AFTER_CLAIM).await;
        }
        Ok((rows, lease_ends))
    }

    /// Delivers one claimed row, unless its lease could run out before the call ends.
    pub(crate) async fn send_within_lease(
        &self,
        row: outbox_row::Model,
        lease_ends: Instant,
    ) -> anyhow::Result<(Delivery, i64)> {
        let (trace, span) = row_trace(&row);
        self.send_traced(row, lease_ends, trace)
            .instrument(span)
            .await
    }

    async fn send_traced(
        &self,
        row: outbox_row::Model,
        lease_ends: Instant,
        trace: TraceContext,
    ) -> anyhow::Result<(Delivery, i64)> {
        let id = row.id;
        // Read before the lease is checked: the read may wait for a connection, and the
        // call must still fit in the lease after it.
        let user = self.user_to_change(&row).await?;
        if let Some(unsent) = self.hand_back_unsent(lease_ends) {
            // Nothing is sent, so no delivery span: the row's next delivery has one.
            return Ok(unsent(&row));
        }
        let exported = delivery_span(&row, trace);
        let effect = row.effect_type.clone();
        let sent = self
            .deliver(row, user, trace, lease_ends)
            .await
            .map(|delivery| (delivery, id));
        end_delivery_span(exported, &sent);
        let (delivery, id) = sent?;
        metrics::delivery(&effect, delivery.outcome());
        Ok((delivery, id))
    }

    /// The user a change row goes to: the one its student is linked to (its rows wait
    /// behind its create-user row, so it is linked by now), never whichever user Users
    /// finds for the student. `None` for a create-user row.
    async fn user_to_change(&self, row: &outbox_row::Model) -> anyhow::Result<Option<Uuid>> {
        match row.operation() {
            Some(Operation::CreatesTheUser) => Ok(None),
            // (A row of an unknown effect fails before any call; reading is harmless.)
            Some(Operation::ChangesTheLinkedUser) | None => {
                Ok(students::linked_user(&self.db, row.aggregate_id).await?)
            }
        }
    }

    async fn deliver(
        &self,
        row: outbox_row::Model,
        user: Option<Uuid>,
        trace: TraceContext,
        lease_ends: Instant,
    ) -> anyhow::Result<Delivery> {
        let effect = match Effect::decode(&row.effect_type, &row.payload) {
            Ok(effect) => effect,
            Err(err) => {
                // No attempt can ever send this row: fail it visibly instead of looping, and
                // hold back no other row.
                tracing::error!(outbox_id = row.id, effect = %row.effect_type, error = %err, "undeliverable outbox row");
                let problem = Problem::new(err.code(), err.to_string());
                return self.fail(&row, FailureKind::Rejected, &problem).await;
            }
        };
        // A change with no linked user to go to is not sent, since Users would change
        // whichever user it finds. Its rows wait behind its create-user row, so only a
        // student unlinked or deleted by hand gets here.
        let goes_to_the_linked_user = match effect.kind().operation() {
            Operation::ChangesTheLinkedUser => true,
            Operation::CreatesTheUser => false,
        };
        if user.is_none() && goes_to_the_linked_user {
            let problem = Problem::new(
                "NOT_LINKED",
                format!(
                    "student {} is linked to no user, so the change has no user to go to",
                    row.aggregate_id
                ),
            );
            return self.fail(&row, FailureKind::Rejected, &problem).await;
        }
        let answer = self
            .call_until_answered(lease_ends, || {
                self.users
                    .deliver(Key::of(&row, trace), &effect, user, false)
            })
            .await;
        self.conclude(&row, &effect, answer).await
    }

    /// Records what Users answered to `row`'s call: the user linked and the row done, or
    /// the failure handled (retried, failed, given back).
    pub(crate) async fn conclude(
        &self,
        row: &outbox_row::Model,
        effect: &Effect,
        answer: Result<users_client::Answer, tonic::Status>,
    ) -> anyhow::Result<Delivery> {
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => return self.record_error(row, &status).await,
        };
        failpoint::hit(points::RELAY_BEFORE_FINALIZE).await;
        let delivered = Delivered::of(effect, answer.user_id);
        let recorded = match &self.finalizer {
            Some(finalizer) => finalizer.record(row, delivered).await,
            None => outbox::record_delivery(&self.db, row, &self.id, delivered).await,
        };
        match recorded {
            Ok(()) => {
                metrics::link_latency(row.created_at);
                let message = match delivered {
                    Delivered::UserCreated(_) => "delivered and linked",
                    Delivered::UserChanged(_) => "delivered and synced",
                };
                tracing::info!(
                    outbox_id = row.id,
                    effect = effect.effect_type(),
                    student_id = %row.aggregate_id,
                    version = row.aggregate_version,
                    user_id = %answer.user_id,
                    applied = answer.applied,
                    from_inbox = answer.from_inbox,
                    attempts = row.attempts,
                    relay = %self.id,
                    "{message}"
                );
                Ok(Delivery::Delivered {
                    replayed: answer.from_inbox,
                })
            }
            Err(RecordError::ClaimLost(_)) => {
                // Another relay took the row after this one's lease ran out (it gets the
                // same answer from Users' inbox), or the row was failed or re-keyed.
                tracing::warn!(
                    outbox_id = row.id,
                    student_id = %row.aggregate_id,
                    relay = %self.id,
                    "late finalize lost: the row is no longer held by this claim; changed nothing"
                );
                Ok(Delivery::Superseded)
            }
            Err(
                err @ (RecordError::LinkConflict { .. }
                | RecordError::NotLinked { .. }
                | RecordError::StudentMissing(_)),
            ) => {
                tracing::error!(outbox_id = row.id, error = %err, "cannot record the delivery on the student");
                let problem = Problem::new(err.code(), err.to_string());
                self.fail(row, FailureKind::Rejected, &problem).await
            }
            Err(RecordError::Db(err)) => Err(err.into()),
        }
    }

    /// Makes a call to Users (`call` makes it afresh each time). A call Users sheds
    /// (RESOURCE_EXHAUSTED: over its `--max-concurrent-requests`, nothing judged) makes this
    /// relay send fewer calls at once and is sent again after the wait Users asked for
    /// (jittered, so shed calls do not come back together), as long as the lease still
    /// covers it: a shed costs one refused call, not a write. A shed answer that the lease
    /// cannot cover, or that comes once the relay is stopping, is returned as is.
    pub(crate) async fn call_until_answered<T, F, Fut>(
        &self,
        lease_ends: Instant,
        mut call: F,
    ) -> Result<T, tonic::Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        loop {
            let call_started = Instant::now();
            let answer = call().await;
            metrics::users_call(call_started.elapsed());
            let status = match answer {
                Err(status) if status.code() == Code::ResourceExhausted => status,
                answer => {
                    self.budget.answered();
                    return answer;
                }
            };
            if let Some(limit) = self.budget.shed() {
                tracing::info!(limit, "Users is shedding calls; sending fewer at once");
            }
            let asked = platform::status::retry_after(&status).unwrap_or(self.config.backoff_base);
            let wait = asked.mul_f64(1.0 + fastrand::f64());
            if !sent_again_within(Instant::now(), wait, self.config.call_timeout, lease_ends) {
                return Err(status);
            }
            tracing::debug!(retry_in = ?wait, "call shed by Users; sending it again");
            // A stopping relay (told before or during the wait) sends nothing again, or its
            // stop would wait up to a lease, not one call, for a Users that keeps shedding:
            // the row goes back now, its attempt handed back, for a relay that is not stopping.
            tokio::select! {
                biased;
                () = self.stopping.cancelled() => return Err(status),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Marks `row` failed, if this relay still holds it.
    async fn fail(
        &self,
        row: &outbox_row::Model,
        kind: FailureKind,
        problem: &Problem,
    ) -> anyhow::Result<Delivery> {
        if outbox::record_failure(&self.db, row, &self.id, kind, problem).await? {
            Ok(Delivery::Failed)
        } else {
            Ok(self.superseded(row))
        }
    }

    fn superseded(&self, row: &outbox_row::Model) -> Delivery {
        tracing::warn!(
            outbox_id = row.id,
            relay = %self.id,
            "the row is no longer held by this claim; outcome not recorded"
        );
        Delivery::Superseded
    }

    async fn record_error(
        &self,
        row: &outbox_row::Model,
        status: &tonic::Status,
    ) -> anyhow::Result<Delivery> {
        let code = code_name(status.code());
        // A stable reason and a readable message, never transport internals: the
        // `ErrorInfo` reason when Users gave one (`DOCUMENT_NUMBER_TAKEN`), else the code.
        let problem = Problem::new(
            platform::status::reason(status).unwrap_or_else(|| code.to_owned()),
            status.message(),
        );
        if status.code() == Code::ResourceExhausted {
            return self.record_shed(row, status, &problem).await;
        }
        let attempts = u32::try_from(row.attempts).unwrap_or(0);
        match classify(status) {
            Failure::Permanent => {
                let kind = permanent_failure_kind(&problem.code);
                tracing::warn!(outbox_id = row.id, student_id = %row.aggregate_id, code, reason = %problem.code, "rejected by Users, marked failed");
                self.fail(row, kind, &problem).await
            }
            Failure::Transient if attempts >= self.config.max_attempts => {
                tracing::error!(
                    outbox_id = row.id,
                    attempts,
                    code,
                    "attempts exhausted, marked failed"
                );
                self.fail(row, FailureKind::Exhausted, &problem).await
            }
            Failure::Transient => {
                let delay =
                    retry_delay(attempts, self.config.backoff_base, self.config.backoff_max);
                tracing::warn!(outbox_id = row.id, attempts, code, retry_in = ?delay, "delivery failed, will retry");
                if outbox::record_retry(&self.db, row, &self.id, &problem, delay).await? {
                    Ok(Delivery::Retried)
                } else {
                    Ok(self.superseded(row))
                }
            }
        }
    }

    /// Users shed the call (over its `--max-concurrent-requests`) and the lease left no
    /// time to send it again, or the relay is stopping: Users judged nothing, so the row goes back with its attempt
    /// handed back, due after the wait Users asked for.
    async fn record_shed(
        &self,
        row: &outbox_row::Model,
        status: &tonic::Status,
        problem: &Problem,
    ) -> anyhow::Result<Delivery> {
        let delay = platform::status::retry_after(status).unwrap_or(self.config.backoff_base);
        tracing::info!(outbox_id = row.id, retry_in = ?delay, "call shed by Users and not sent again (too little lease left, or the relay is stopping); the row goes back with its attempt");
        if outbox::record_shed(&self.db, row, &self.id, problem, delay).await? {
            Ok(Delivery::Shed)
        } else {
            Ok(self.superseded(row))
        }
    }
}

/// Whether a shed call sent again after `wait` would end, at its deadline, before its
/// rows' lease does: the wait counts, or the call could run past the lease while another
/// relay claims the rows and sends their keys too.
fn sent_again_within(
    now: Instant,
    wait: Duration,
    call_timeout: Duration,
    lease_ends: Instant,
) -> bool {
    now + wait + call_timeout < lease_ends
}

/// How a row goes back unsent (see [`Relay::hand_back_unsent`]).
pub(crate) type HandBack = fn(&outbox_row::Model) -> (Delivery, i64);

/// What became of one claimed row.
pub(crate) enum Delivery {
    /// Recorded as done; `replayed` when Users answered from its inbox.
    Delivered {
        replayed: bool,
    },
    Retried,
    Failed,
    /// Handed back unsent: a lease too short to send within, or the relay stopping. The
    /// claim it was sent under, so that only that claim is given back.
    Unsent(outbox::Claim),
    /// Shed by Users unjudged, and given back with its attempt.
    Shed,
    Superseded,
}

/// Ends a row's delivery span with what became of the row: an error for a row retried or
/// failed, or when its answer could not be recorded.
pub(crate) fn end_delivery_span(mut span: ExportedSpan, sent: &anyhow::Result<(Delivery, i64)>) {
    match sent {
        Ok((delivery, _)) => {
            let outcome = delivery.outcome();
            span.set("outbox.outcome", outcome.label());
            if matches!(outcome, Outcome::Retried | Outcome::Failed) {
                span.fail(outcome.label());
            }
        }
        Err(err) => span.fail(&format!("{err:#}")),
    }
}

impl Delivery {
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Self::Delivered { replayed: false } => Outcome::Linked,
            Self::Delivered { replayed: true } => Outcome::Replayed,
            Self::Retried => Outcome::Retried,
            Self::Failed => Outcome::Failed,
            Self::Unsent(_) | Self::Shed => Outcome::Released,
            Self::Superseded => Outcome::Superseded,
        }
    }
}

/// The calls a claim's rows go in: its `create-user` rows in the fewest groups of at most
/// `rows_per_call`, as even as that allows (so that the calls of one claim finish about
/// together), each a CreateUsers call when it holds two or more; every other row in a call
/// of its own (Users has no batch of changes).
fn calls_of(rows: Vec<outbox_row::Model>, rows_per_call: usize) -> Vec<Vec<outbox_row::Model>> {
    let (creations, changes): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .partition(|row| row.effect_type == student_store::effect::CREATE_USER);
    let mut calls = split_evenly(creations, rows_per_call);
    calls.extend(changes.into_iter().map(|row| vec![row]));
    calls
}

/// `items` in order, in the fewest groups of at most `per_call` each, their sizes differing
/// by one at most (the larger first).
fn split_evenly<T>(mut items: Vec<T>, per_call: usize) -> Vec<Vec<T>> {
    let calls = items.len().div_ceil(per_call.max(1));
    let mut groups = Vec::with_capacity(calls);
    for left in (1..=calls).rev() {
        let take = items.len().div_ceil(left);
        let rest = items.split_off(take);
        groups.push(std::mem::replace(&mut items, rest));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README: a shed call is sent again after its wait only inside its rows' lease.
    #[test]
    fn a_shed_call_is_sent_again_only_if_it_ends_inside_the_lease_after_its_wait() {
        let now = Instant::now();
        let lease_ends = now + Duration::from_secs(5);
        let call = Duration::from_secs(2);
        assert!(sent_again_within(
            now,
            Duration::from_secs(2),
            call,
            lease_ends
        ));
        // The call alone would fit; after the wait it would not.
        assert!(!sent_again_within(
            now,
            Duration::from_millis(3_500),
            call,
            lease_ends
        ));
        assert!(!sent_again_within(
            now,
            Duration::from_secs(3),
            call,
            lease_ends
        ));
    }

    #[test]
    fn rows_are_split_into_the_fewest_calls_as_evenly_as_they_go() {
        let sizes = |n: usize, per_call| -> Vec<usize> {
            split_evenly((0..n).collect(), per_call)
                .iter()
                .map(Vec::len)
                .collect()
        };
        assert_eq!(sizes(9, 4), [3, 3, 3]);
        assert_eq!(sizes(10, 4), [4, 3, 3]);
        assert_eq!(sizes(16, 4), [4, 4, 4, 4]);
        assert_eq!(sizes(17, 16), [9, 8]);
        assert_eq!(sizes(1, 16), [1]);
        assert!(sizes(0, 16).is_empty());
        assert_eq!(sizes(3, 0), [1, 1, 1], "0 rows per call counts as 1");
        let groups = split_evenly((0..5).collect::<Vec<i32>>(), 2);
        assert_eq!(groups, [vec![0, 1], vec![2, 3], vec![4]], "in order");
    }

    /// README: the `create-user` rows of a claim go together, however the claim mixes
    /// them with changes; each change goes alone.
    #[test]
    fn a_claims_creations_go_together_and_each_change_alone() {
        let row = |id: i64, effect: &str| outbox_row::Model {
            effect_type: effect.into(),
            ..crate::test_rows::row(id, 1)
        };
        use student_store::effect::{CREATE_USER, UPDATE_USER};
        // Creations first and last, fifteen changes between them.
        let rows: Vec<_> = (0..17)
            .map(|id| {
                row(
                    id,
                    if id % 16 == 0 {
                        CREATE_USER
                    } else {
                        UPDATE_USER
                    },
                )
            })
            .collect();
        let ids = |calls: Vec<Vec<outbox_row::Model>>| -> Vec<Vec<i64>> {
            calls
                .into_iter()
                .map(|call| call.iter().map(|row| row.id).collect())
                .collect()
        };
        let calls = ids(calls_of(rows.clone(), 16));
        assert_eq!(calls.len(), 16, "{calls:?}");
        assert_eq!(calls[0], [0, 16]);
        assert!(calls[1..].iter().all(|call| call.len() == 1), "{calls:?}");
        // Seventeen creations: two calls, 9 and 8.
        let creations: Vec<_> = (0..17).map(|id| row(id, CREATE_USER)).collect();
        let sizes: Vec<_> = calls_of(creations, 16).iter().map(Vec::len).collect();
        assert_eq!(sizes, [9, 8]);
    }
}
