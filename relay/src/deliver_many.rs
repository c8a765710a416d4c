//! Many rows to one call: the `create-user` rows of a claim go to Users together, in one
//! CreateUsers call (one Users transaction for the rows it executes), up to
//! `--rows-per-call` at a time; other rows go one call each.
//!
//! Nothing about a row's guarantees changes: each row is sent under its own key, Users
//! answers each item as CreateUser would answer it alone, and each answer is recorded as a
//! single call's would be (the finalizer commits them together). A call that fails as a
//! whole (Users down, a deadline) is every row's failure: none of its items was written,
//! or, if Users committed and the answer was lost, each key's answer is in Users' inbox
//! for the next attempt.

use std::{sync::atomic::Ordering, time::Instant};

use futures::future::join_all;
use student_store::{
    effect::{CreateUserPayload, Effect},
    entity::outbox as outbox_row,
};
use tonic::Code;
use tracing::Instrument as _;

use crate::{
    Relay,
    deliver::{Delivery, end_delivery_span},
    metrics,
    users_client::{Key, delivery_span, row_trace},
};

/// One row's result: what became of it, and its id.
type RowResult = anyhow::Result<(Delivery, i64)>;

impl Relay {
    /// Delivers one call's rows (see `calls_of`: a change row alone, or `create-user`
    /// rows): the `create-user` rows in one CreateUsers call when there are two or more of
    /// them, every other row (a change, or a row whose payload cannot be read, which then
    /// fails on its own) in a call of its own. Returns one result per row.
    pub(crate) async fn send_rows_within_lease(
        &self,
        rows: Vec<outbox_row::Model>,
        lease_ends: Instant,
    ) -> Vec<RowResult> {
        if rows.len() < 2 || self.one_row_per_call.load(Ordering::Relaxed) {
            return self.send_each(rows, lease_ends).await;
        }
        let mut creations = Vec::new();
        let mut others = Vec::new();
        for row in rows {
            match Effect::decode(&row.effect_type, &row.payload) {
                Ok(Effect::CreateUser(payload)) => creations.push((row, payload)),
                _ => others.push(row),
            }
        }
        if creations.len() < 2 {
            others.extend(creations.into_iter().map(|(row, _)| row));
            return self.send_each(others, lease_ends).await;
        }
        let (mut results, created) = tokio::join!(
            self.send_each(others, lease_ends),
            self.send_creations(creations, lease_ends)
        );
        results.extend(created);
        results
    }

    /// Delivers each row in a call of its own, all at once.
    async fn send_each(&self, rows: Vec<outbox_row::Model>, lease_ends: Instant) -> Vec<RowResult> {
        join_all(
            rows.into_iter()
                .map(|row| self.send_within_lease(row, lease_ends)),
        )
        .await
    }

    /// Sends `creations` in one CreateUsers call and records each row's answer.
    async fn send_creations(
        &self,
        creations: Vec<(outbox_row::Model, CreateUserPayload)>,
        lease_ends: Instant,
    ) -> Vec<RowResult> {
        let traced: Vec<_> = creations.iter().map(|(row, _)| row_trace(row)).collect();
        // As for a single row (`send_traced`): no call once stopping, nor one the lease
        // cannot cover. (Nothing is sent, so no delivery span.)
        if let Some(unsent) = self.hand_back_unsent(lease_ends) {
            return creations
                .iter()
                .zip(traced)
                .map(|((row, _), (_, span))| Ok(span.in_scope(|| unsent(row))))
                .collect();
        }
        let spans: Vec<_> = creations
            .iter()
            .zip(&traced)
            .map(|((row, _), (trace, _))| delivery_span(row, *trace))
            .collect();
        let items: Vec<_> = creations
            .iter()
            .zip(&traced)
            .map(|((row, payload), (trace, _))| (Key::of(row, *trace), payload))
            .collect();
        let answers = match self
            .call_until_answered(lease_ends, || self.users.create_users(&items))
            .await
        {
            Ok(answers) => answers,
            Err(status) if refused_whole(status.code()) => {
                if status.code() == Code::Unimplemented {
                    // A Users older than CreateUsers: one call per row, from now on.
                    tracing::warn!(
                        "Users does not serve CreateUsers; sending one CreateUser call per row"
                    );
                    self.one_row_per_call.store(true, Ordering::Relaxed);
                } else {
                    tracing::warn!(code = ?status.code(), rows = creations.len(), "Users refused a CreateUsers call as a whole; sending its rows one call each");
                }
                drop(items);
                // Each row's span ends with the refusal; sent again alone, it gets another.
                for span in spans {
                    span.fail(status.message());
                }
                // (A relay stopping meanwhile sends none of them: `hand_back_unsent`.)
                let rows = creations.into_iter().map(|(row, _)| row).collect();
                return self.send_each(rows, lease_ends).await;
            }
            Err(status) => vec![Err(status); creations.len()],
        };
        drop(items);
        join_all(
            creations
                .into_iter()
                .zip(answers)
                .zip(traced)
                .zip(spans)
                .map(|((((row, payload), answer), (_, span)), exported)| {
                    async move {
                        let effect = Effect::CreateUser(payload);
                        let concluded = async {
                            let delivery = self.conclude(&row, &effect, answer).await?;
                            metrics::delivery(&row.effect_type, delivery.outcome());
                            Ok((delivery, row.id))
                        }
                        .await;
                        end_delivery_span(exported, &concluded);
                        concluded
                    }
                    .instrument(span)
                }),
        )
        .await
    }
}

/// Whether a CreateUsers call's failure is about the call, not its rows, so that each row
/// sent on its own would be judged on its merits: a Users that does not serve CreateUsers
/// (UNIMPLEMENTED), a call over Users' message size limit (OUT_OF_RANGE: many rows with
/// long fields), a call Users cannot take apart (INVALID_ARGUMENT: it judges no item).
/// Marking the rows failed, or retrying the same call, would be wrong for each of them.
fn refused_whole(code: Code) -> bool {
    matches!(
        code,
        Code::Unimplemented | Code::OutOfRange | Code::InvalidArgument
    )
}
