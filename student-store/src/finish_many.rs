//! Finishing many deliveries set-based instead of two statements per row: the relay's
//! group commit ([`crate::outbox::record_deliveries`]) tries this first.
//!
//! The answers go in as a `VALUES` list, and each statement joins it (`UPDATE … FROM`,
//! PostgreSQL and SQLite alike):
//! 1. the rows still held by their claims become `done`, fenced exactly as a single
//!    delivery is (status, relay, attempt, key); rows whose claim is gone are left alone;
//! 2. the students of the rows that became `done` are linked and their `synced_version`
//!    raised, each only if the user Users answered with may be theirs.
//!
//! On SQLite the two run in one transaction. If any student refuses its user (a link
//! conflict, a missing student), they cannot tell which row must stay undone: the caller
//! rolls the transaction back and records the batch row by row, each with its own
//! savepoint, which can.
//!
//! On PostgreSQL both are one statement, its own transaction ([`finish_in_one_statement`]):
//! no `BEGIN`, no `COMMIT`, one round trip instead of four. It locks and checks each row
//! and its student before it writes either, so it finishes exactly the rows whose claim
//! holds and whose student takes the user, and leaves the others as they were.

use std::collections::HashSet;

use platform::db::now;
use sea_orm::{
    ActiveEnum as _, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value,
};

use crate::{
    entity::outbox::{self, OutboxStatus},
    outbox::{Delivered, RecordError},
};

/// What the two statements (SQLite) did, when they could decide every row.
pub(crate) type Finished = Vec<Result<(), RecordError>>;

/// SQLite: runs the two statements inside the caller's transaction `txn`. Returns each row's
/// result in order, or `None` when a student refused its user: the caller must then roll
/// `txn` back (the statements have written) and record the rows one by one.
///
/// Rows of one student must not share a batch (one join row per student per statement);
/// the caller checks. The claim never hands out two rows of a student at once, so this only
/// rules out a late finish meeting a newer claim.
pub(crate) async fn finish_all(
    txn: &impl ConnectionTrait,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Result<Option<Finished>, DbErr> {
    let backend = txn.get_database_backend();
    let done: HashSet<i64> = mark_held_rows_done(txn, backend, relay_id, deliveries)
        .await?
        .into_iter()
        .collect();
    // Crash point: rows marked done, their students not yet linked; neither is committed.
    platform::failpoint::hit(platform::failpoint::points::RELAY_BETWEEN_FINISH_STATEMENTS).await;
    let held: Vec<_> = deliveries
        .iter()
        .filter(|(row, _)| done.contains(&row.id))
        .collect();
    if !held.is_empty() && link_students(txn, backend, &held).await? != held.len() {
        return Ok(None);
    }
    Ok(Some(
        deliveries
            .iter()
            .map(|(row, _)| {
                if done.contains(&row.id) {
                    Ok(())
                } else {
                    Err(RecordError::ClaimLost(row.id))
                }
            })
            .collect(),
    ))
}

/// Statement 1: every row still held by its claim becomes `done` with its user, lease
/// cleared. Returns the ids it changed.
async fn mark_held_rows_done(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Result<Vec<i64>, DbErr> {
    let rows = txn
        .query_all_raw(done_statement(backend, relay_id, deliveries))
        .await?;
    rows.iter()
        .map(|row| row.try_get::<i64>("", "id"))
        .collect()
}

/// The text and values of statement 1.
pub(crate) fn done_statement(
    backend: DbBackend,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Statement {
    let mut sql = Sql::new(backend);
    let answered = sql.values_list(deliveries.iter().map(|(row, delivered)| {
        [
            row.id.into(),
            row.attempts.into(),
            row.idempotency_key.as_str().into(),
            delivered.user_id().to_string().into(),
        ]
    }));
    let text = format!(
        r#"WITH answered (row_id, attempt, key, user_id) AS (VALUES {answered})
           UPDATE outbox
              SET status = {done}, result = answered.user_id, processed_at = {at},
                  last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
             FROM answered
            WHERE outbox.id = answered.row_id
              AND outbox.status = {processing}
              AND outbox.locked_by = {relay}
              AND outbox.attempts = answered.attempt
              AND outbox.idempotency_key = answered.key
        RETURNING id"#,
        done = sql.bind(OutboxStatus::Done.to_value()),
        at = sql.bind(now()),
        processing = sql.bind(OutboxStatus::Processing.to_value()),
        relay = sql.bind(relay_id),
    );
    sql.statement(text)
}

/// Statement 2: each student of `held` raises its `synced_version` to its row's (never
/// lowering it); a created user is linked where none is yet. Only where the answered user
/// may be the student's: for a created user, none linked yet or that same one; for a
/// changed user, the one linked. Returns how many students it changed.
async fn link_students(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    held: &[&(outbox::Model, Delivered)],
) -> Result<usize, DbErr> {
    Ok(txn
        .query_all_raw(link_statement(backend, held))
        .await?
        .len())
}

/// The text and values of statement 2.
pub(crate) fn link_statement(
    backend: DbBackend,
    held: &[&(outbox::Model, Delivered)],
) -> Statement {
    let mut sql = Sql::new(backend);
    let answered = sql.values_list(held.iter().map(|(row, delivered)| {
        [
            row.aggregate_id.into(),
            row.aggregate_version.into(),
            delivered.user_id().into(),
            matches!(delivered, Delivered::UserCreated(_)).into(),
        ]
    }));
    let at = sql.bind(now());
    let text = format!(
        r#"WITH answered (student_id, version, user_id, created) AS (VALUES {answered})
           UPDATE students
              SET {link}
             FROM answered
            WHERE students.id = answered.student_id
              AND {may_take}
        RETURNING id"#,
        link = link_assignments("answered", &at),
        may_take = may_take_user("answered"),
    );
    sql.statement(text)
}

/// Whether a student may take the user of the answer in `answer` (a table or CTE with
/// `user_id` and `created`): for a created user, none linked yet or that same one; for a
/// changed user, the one linked. Both the SQLite and the PostgreSQL finish check it.
fn may_take_user(answer: &str) -> String {
    format!(
        "(students.user_id = {answer}.user_id
          OR ({answer}.created AND students.user_id IS NULL))"
    )
}

/// The `SET` list that links a student to the user of the answer in `answer` (with
/// `version`, `user_id`, `created`): `synced_version` raised to the row's version, never
/// lowered; a created user linked, and `updated_at` moved to `at` with it.
fn link_assignments(answer: &str, at: &str) -> String {
    format!(
        "synced_version = CASE WHEN students.synced_version < {answer}.version
                               THEN {answer}.version
                               ELSE students.synced_version END,
         user_id = CASE WHEN {answer}.created THEN {answer}.user_id
                        ELSE students.user_id END,
         updated_at = CASE WHEN {answer}.created THEN {at}
                           ELSE students.updated_at END"
    )
}

/// What [`finish_in_one_statement`] did with one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// `done`, its student linked.
    Done,
    /// No longer held by its claim: nothing written.
    ClaimLost,
    /// Still held, but its student does not take the user (or is gone): nothing written.
    Refused,
}

/// PostgreSQL: finishes `deliveries` in ONE statement, which is its own transaction.
/// Returns what it did with each row, in order.
///
/// Rows of one student must not share a batch (see [`finish_all`]).
pub(crate) async fn finish_in_one_statement(
    db: &DatabaseConnection,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Result<Vec<Finish>, DbErr> {
    let rows = db
        .query_all_raw(one_statement(relay_id, deliveries))
        .await?;
    let mut held = HashSet::new();
    let mut done = HashSet::new();
    for row in &rows {
        let id: i64 = row.try_get("", "id")?;
        held.insert(id);
        if row.try_get::<bool>("", "done")? {
            done.insert(id);
        }
    }
    Ok(deliveries
        .iter()
        .map(
            |(row, _)| match (held.contains(&row.id), done.contains(&row.id)) {
                (_, true) => Finish::Done,
                (true, false) => Finish::Refused,
                (false, false) => Finish::ClaimLost,
            },
        )
        .collect())
}

/// The text and values of the PostgreSQL statement that finishes a batch.
///
/// `held` locks each row still held by its claim (`FOR UPDATE` re-checks the fence on the
/// row's newest version), then `accepted` locks the student of each and keeps the rows
/// whose student may take the user, checked the same way. Both locks are taken before
/// anything is written, row before student as every other finish takes them, and stay
/// until the statement commits: so `done` and `linked` change exactly the rows and students
/// of `accepted`, and a row is never `done` without its student showing it.
pub(crate) fn one_statement(
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Statement {
    let mut sql = Sql::new(DbBackend::Postgres);
    let answered = sql.values_list(deliveries.iter().map(|(row, delivered)| {
        [
            row.id.into(),
            row.attempts.into(),
            row.idempotency_key.as_str().into(),
            row.aggregate_id.into(),
            row.aggregate_version.into(),
            delivered.user_id().into(),
            matches!(delivered, Delivered::UserCreated(_)).into(),
        ]
    }));
    let processing = sql.bind(OutboxStatus::Processing.to_value());
    let relay = sql.bind(relay_id);
    let done = sql.bind(OutboxStatus::Done.to_value());
    let at = sql.bind(now());
    let text = format!(
        r#"WITH answered (row_id, attempt, key, student_id, version, user_id, created) AS (VALUES {answered}),
             held AS MATERIALIZED (
               SELECT answered.* FROM answered JOIN outbox ON outbox.id = answered.row_id
                WHERE outbox.status = {processing}
                  AND outbox.locked_by = {relay}
                  AND outbox.attempts = answered.attempt
                  AND outbox.idempotency_key = answered.key
                ORDER BY answered.row_id
                  FOR UPDATE OF outbox),
             accepted AS MATERIALIZED (
               SELECT held.* FROM held JOIN students ON students.id = held.student_id
                WHERE {may_take}
                  FOR UPDATE OF students),
             done AS (
               UPDATE outbox
                  SET status = {done}, result = accepted.user_id::text, processed_at = {at},
                      last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
                 FROM accepted
                WHERE outbox.id = accepted.row_id
               RETURNING outbox.id),
             linked AS (
               UPDATE students
                  SET {link}
                 FROM accepted
                WHERE students.id = accepted.student_id
               RETURNING students.id)
        SELECT held.row_id AS id, held.row_id IN (SELECT id FROM done) AS done FROM held"#,
        may_take = may_take_user("held"),
        link = link_assignments("accepted", &at),
    );
    sql.statement(text)
}

/// SQL text with its bound values, placeholders spelled for the backend (`$1` or `?`) in
/// the order they are bound. SQLite's `?` are numbered by where they stand in the text, so
/// each statement binds its values in the order their placeholders appear.
struct Sql {
    backend: DbBackend,
    values: Vec<Value>,
}

impl Sql {
    fn new(backend: DbBackend) -> Self {
        Self {
            backend,
            values: Vec::new(),
        }
    }

    /// Binds `value`; returns its placeholder.
    fn bind(&mut self, value: impl Into<Value>) -> String {
        self.values.push(value.into());
        match self.backend {
            DbBackend::Postgres => format!("${}", self.values.len()),
            _ => "?".to_owned(),
        }
    }

    /// Binds each tuple of `rows`; returns `(…), (…), …` for a `VALUES` list.
    fn values_list<const N: usize>(&mut self, rows: impl Iterator<Item = [Value; N]>) -> String {
        rows.map(|row| {
            let placeholders: Vec<_> = row.into_iter().map(|value| self.bind(value)).collect();
            format!("({})", placeholders.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
    }

    fn statement(self, text: String) -> Statement {
        Statement::from_sql_and_values(self.backend, text, self.values)
    }
}
