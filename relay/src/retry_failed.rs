//! `relay retry-failed`: redrives failed rows.
//!
//! A row that ran out of attempts (Users unreachable for too long) goes back to `pending`
//! with its key: Users never executed it, or executed it and will answer from its inbox.
//! So does a change Users refused because it had lost the student's user
//! (`USER_NOT_FOUND`, saved under no key), once the user is restored.
//! A row Users *rejected* would get the same saved rejection for the same key, so it is
//! redriven only with `--new-key`: a fresh key, explicitly a new operation.
//!
//! A new key is never given blindly. The old key may have been executed after all (Users
//! committed, its answer was lost, then Users stayed unreachable until the row ran out of
//! attempts): a new key would then be judged as a second operation, rejected because the
//! student's own user holds the document number (the student stranded, FAILED forever), or
//! executed if that user was disabled meanwhile (a second user). So Users is first asked,
//! replay-only, what the old key got: a created user is linked and the row marked `done`.
//!
//! Any other answer says nothing about the student for a create-user row: a key older than
//! Users' inbox retention that it does not hold may have run and been purged (Users answers
//! `DELIVERY_EXPIRED`), a key purged before Users kept keys longer reads `NOT_IN_INBOX`,
//! and a saved rejection may be the student's own user, created under an earlier key,
//! holding the number. So such a row takes a new key only if Users holds no user of its
//! student (ListUsers; Users never deletes a user): one is the user the row stands for, and
//! is linked; several are left to the operator (`--link-user`, [`link_user`]). A change
//! takes its new key whatever became of the old one (Users applies each student version at
//! most once). An `expired` row is never redriven without `--new-key`.
//!
//! The question is safe to ask: a `failed` row is held by no relay, and every send ends
//! inside its lease, so no call with the old key is still on its way to Users.

use std::io::Write;

use sea_orm::DatabaseConnection;
use student_store::{
    effect::{Effect, Operation},
    entity::outbox::{self as outbox_row, FailureKind},
    outbox::{self, Delivered, RecordError},
    students,
};
use tonic::Code;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::{
    classify::{DELIVERY_EXPIRED, USER_NOT_FOUND},
    users_client::{
        Key, UsersClient, cannot_ask, delivery_span, row_trace, unless_shed, was_replayed,
    },
};

/// Which failed rows to redrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Id(i64),
    All,
}

/// Totals of a retry-failed run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetrySummary {
    /// Rows put back to `pending` (with their key, or a new one).
    pub requeued: usize,
    /// Rows linked to their user (or recorded synced) and `done`, not re-keyed.
    pub linked: usize,
    pub skipped: usize,
    pub errors: usize,
}

impl RetrySummary {
    /// 0 when every selected row was requeued or linked, 1 when some were skipped, 2 on an
    /// error.
    pub fn exit_code(&self) -> u8 {
        if self.errors > 0 {
            2
        } else if self.skipped > 0 {
            1
        } else {
            0
        }
    }
}

/// What Users' inbox says about a failed row's old key.
pub(crate) enum OldKey {
    /// Executed: the user was created (or changed) for this row.
    Executed(Delivered),
    /// Nothing the key created: it is not in the inbox (never executed; or, past the
    /// horizon or purged before Users kept keys longer, executed and purged), or its saved
    /// answer is a rejection. Which, and whether another key created the student's user,
    /// the key cannot say.
    NothingKnown,
}

/// What `retry-failed` may do with the selected rows' keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// Requeue `exhausted` rows with their own key (no `--new-key`).
    Keep,
    /// `--new-key`: a fresh key where the old one is known to have created nothing, and for
    /// a change whatever became of it.
    New,
}

/// Requeues the selected failed rows, printing one line per row and a summary line.
pub async fn retry_failed(
    db: &DatabaseConnection,
    users: &UsersClient,
    selection: Selection,
    keys: Keys,
    out: &mut impl Write,
) -> anyhow::Result<RetrySummary> {
    let id = match selection {
        Selection::Id(id) => Some(id),
        Selection::All => None,
    };
    let rows = outbox::failed_rows(db, id).await?;
    let mut summary = RetrySummary::default();
    if let (Selection::Id(id), true) = (selection, rows.is_empty()) {
        writeln!(out, "no failed outbox row has id {id}")?;
        summary.errors += 1;
    }
    for row in rows {
        match keys {
            Keys::Keep => requeue_with_its_key(db, &row, out, &mut summary).await?,
            Keys::New => with_a_new_key_where_safe(db, users, &row, out, &mut summary).await?,
        }
    }
    finish(summary, out)
}

/// Without `--new-key`: an `exhausted` row goes back to `pending` with its own key (the
/// same operation tried again: safe whatever Users did with the key), and so does a change
/// Users refused `USER_NOT_FOUND` (it saved nothing under the key; the user restored, the
/// same key reaches it); another rejected or an expired one is skipped with what it needs.
async fn requeue_with_its_key(
    db: &DatabaseConnection,
    row: &outbox_row::Model,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    let line = row_line(row);
    match row.failure_kind {
        Some(FailureKind::Exhausted) => {}
        Some(FailureKind::Rejected) if row.error_code.as_deref() == Some(USER_NOT_FOUND) => {}
        Some(FailureKind::Expired) => {
            writeln!(out, "{line} skipped: {}", expired_advice(row))?;
            summary.skipped += 1;
            return Ok(());
        }
        Some(FailureKind::Rejected) | None => {
            writeln!(
                out,
                "{line} skipped: rejected; the same key gets the same answer, use --new-key"
            )?;
            summary.skipped += 1;
            return Ok(());
        }
    }
    requeue(
        db,
        row,
        &row.idempotency_key,
        &format!("{line} requeued"),
        out,
        summary,
    )
    .await
}

/// With `--new-key`: Users is asked what the old key got first (see the module's comment),
/// and the row is linked, synced, re-keyed or skipped accordingly.
async fn with_a_new_key_where_safe(
    db: &DatabaseConnection,
    users: &UsersClient,
    row: &outbox_row::Model,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    match ask_about_old_key(users, row).await {
        Err(problem) => {
            let line = row_line(row);
            writeln!(out, "{line} not re-keyed: {problem}")?;
            summary.errors += 1;
            Ok(())
        }
        Ok(OldKey::Executed(delivered)) => match changed_another_user(db, row, delivered).await? {
            // The student's linked user never saw this version: a new key, which the relay
            // sends naming that user, applies it there.
            Some(why) => rekey(db, row, Some(&why), out, summary).await,
            None => {
                let found = "Users had executed this key";
                link(db, row, delivered, found, out, summary).await
            }
        },
        Ok(OldKey::NothingKnown) => match row.operation() {
            // Nothing about this key tells whether the student has a user: Users' list does.
            Some(Operation::CreatesTheUser) => {
                by_students_users(db, users, row, out, summary).await
            }
            // A change may take a new key whatever became of the old one: Users applies each
            // student version at most once, so a version it applied already is answered
            // `applied=false` and the row recorded synced. (A row of an unknown effect fails
            // again as such, whatever its key.)
            Some(Operation::ChangesTheLinkedUser) | None => {
                rekey(db, row, None, out, summary).await
            }
        },
    }
}

/// Why a change whose old key Users executed went to another user than the one its
/// student is linked to (sent without naming the user, as relays before `user_id` did,
/// while Users held several users of the student), if it did.
async fn changed_another_user(
    db: &DatabaseConnection,
    row: &outbox_row::Model,
    delivered: Delivered,
) -> anyhow::Result<Option<String>> {
    let Delivered::UserChanged(changed) = delivered else {
        return Ok(None);
    };
    Ok(match students::linked_user(db, row.aggregate_id).await? {
        Some(linked) if linked != changed => Some(format!(
            "Users answered the old key for user {changed}, not for the student's linked user \
             {linked}"
        )),
        _ => None,
    })
}

/// Settles a failed create-user row whose old key created no user that Users knows of, by
/// the users Users holds for its student (it never deletes one): none, so no key of the
/// row created one and it takes a new key; one, the user the row stands for, linked;
/// several, left to the operator (`--link-user`), since nothing here tells which.
async fn by_students_users(
    db: &DatabaseConnection,
    users: &UsersClient,
    row: &outbox_row::Model,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    let line = row_line(row);
    let found = match users_of_student(users, row).await {
        Ok(found) => found,
        Err(problem) => {
            writeln!(out, "{line} not re-keyed: {problem}")?;
            summary.errors += 1;
            return Ok(());
        }
    };
    match found.as_slice() {
        [] => {
            let why = format!("Users holds no user of student {}", row.aggregate_id);
            rekey(db, row, Some(&why), out, summary).await
        }
        [(user_id, _)] => {
            let found = "Users holds it as the student's only user";
            link(
                db,
                row,
                Delivered::UserCreated(*user_id),
                found,
                out,
                summary,
            )
            .await
        }
        several => {
            let listed: Vec<String> = several
                .iter()
                .map(|(id, enabled)| match enabled {
                    true => id.to_string(),
                    false => format!("{id} (disabled)"),
                })
                .collect();
            writeln!(
                out,
                "{line} skipped: student {} has several users in Users, and nothing tells \
                 which one this row stands for: {}. Link one with --id {} --link-user USER_ID",
                row.aggregate_id,
                listed.join(", "),
                row.id
            )?;
            summary.skipped += 1;
            Ok(())
        }
    }
}

/// Links `user_id` to the student of the failed create-user row `id` and marks the row
/// `done` (`retry-failed --id N --link-user U`): for a row whose student has several users,
/// which `--new-key` leaves to the operator (it links an only user itself). Users is asked
/// first: the user must exist and name the row's student, and the row's own key must not
/// have created another one; the link is recorded as a delivery found in the inbox would
/// be (fenced by the row's status and key, never over another link).
pub async fn link_user(
    db: &DatabaseConnection,
    users: &UsersClient,
    id: i64,
    user_id: Uuid,
    out: &mut impl Write,
) -> anyhow::Result<RetrySummary> {
    let mut summary = RetrySummary::default();
    let Some(row) = outbox::failed_rows(db, Some(id)).await?.pop() else {
        writeln!(out, "no failed outbox row has id {id}")?;
        summary.errors += 1;
        return finish(summary, out);
    };
    let line = row_line(&row);
    let student = row.aggregate_id.to_string();
    let refusal = match row.operation() {
        Some(Operation::CreatesTheUser) => why_not_link(users, &row, user_id, &student).await,
        Some(Operation::ChangesTheLinkedUser) | None => {
            Some("only a create-user row links a user; a change takes --new-key".to_owned())
        }
    };
    if let Some(refusal) = refusal {
        writeln!(out, "{line} not linked: {refusal}")?;
        summary.errors += 1;
        return finish(summary, out);
    }
    let found = "Users holds it for this student";
    let delivered = Delivered::UserCreated(user_id);
    link(db, &row, delivered, found, out, &mut summary).await?;
    finish(summary, out)
}

/// Records `delivered` for the failed `row` and marks it `done` (fenced by its status and
/// key, never over another link), printing why (`found`) and counting it `linked`.
async fn link(
    db: &DatabaseConnection,
    row: &outbox_row::Model,
    delivered: Delivered,
    found: &str,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    let line = row_line(row);
    let user_id = delivered.user_id();
    let verb = match delivered {
        Delivered::UserCreated(_) => "linked",
        Delivered::UserChanged(_) => "synced",
    };
    match outbox::record_found_in_inbox(db, row, delivered).await {
        Ok(()) => {
            writeln!(out, "{line} {verb} user={user_id}: {found}; not re-keyed")?;
            summary.linked += 1;
        }
        Err(RecordError::Db(err)) => return Err(err.into()),
        Err(err) => {
            writeln!(
                out,
                "{line} not {verb}: {found} (user={user_id}), but {err}"
            )?;
            summary.errors += 1;
        }
    }
    Ok(())
}

/// Puts the failed `row` back to `pending` under a fresh key, printing `why` if given.
async fn rekey(
    db: &DatabaseConnection,
    row: &outbox_row::Model,
    why: Option<&str>,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    let fresh = Uuid::new_v4().to_string();
    let why = why.map(|why| format!(": {why}")).unwrap_or_default();
    let requeued = format!(
        "id={} key={fresh} requeued (new key; was {}){why}",
        row.id, row.idempotency_key
    );
    requeue(db, row, &fresh, &requeued, out, summary).await
}

/// Puts the failed `row` back to `pending` under `key` (its own or a fresh one), printing
/// `requeued`; a row changed meanwhile (another run, a relay) is left as it is, an error.
async fn requeue(
    db: &DatabaseConnection,
    row: &outbox_row::Model,
    key: &str,
    requeued: &str,
    out: &mut impl Write,
    summary: &mut RetrySummary,
) -> anyhow::Result<()> {
    if outbox::redrive(db, row, key).await? {
        writeln!(out, "{requeued}")?;
        summary.requeued += 1;
    } else {
        writeln!(
            out,
            "{} changed while retrying; left as it is",
            row_line(row)
        )?;
        summary.errors += 1;
    }
    Ok(())
}

/// The users Users holds for `row`'s student, oldest first: each id, and whether it is
/// enabled.
async fn users_of_student(
    users: &UsersClient,
    row: &outbox_row::Model,
) -> Result<Vec<(Uuid, bool)>, String> {
    let found = unless_shed(|| users.list_users(row.aggregate_id))
        .await
        .map_err(|status| {
            cannot_ask(
                &format!("for student {}'s users", row.aggregate_id),
                &status,
            )
        })?;
    found
        .into_iter()
        .map(|user| {
            Uuid::parse_str(&user.id)
                .map(|id| (id, user.enabled))
                .map_err(|_| format!("Users listed a user whose id is not a UUID: {:?}", user.id))
        })
        .collect()
}

/// Why `user_id` must not be linked for `row` as far as Users' inbox knows: the row's
/// own key created another user (link that one: `--new-key` does), or Users could not be
/// asked. `None` when the inbox has nothing against it (the key never ran, was rejected,
/// is too old to judge, or created `user_id` itself).
async fn old_key_created_another(
    users: &UsersClient,
    row: &outbox_row::Model,
    user_id: Uuid,
) -> Option<String> {
    match ask_about_old_key(users, row).await {
        Err(problem) => Some(problem),
        Ok(OldKey::Executed(delivered)) if delivered.user_id() != user_id => Some(format!(
            "Users created user={} for this row's key; --new-key links that one",
            delivered.user_id()
        )),
        Ok(_) => None,
    }
}

/// How every line about `row` starts: `id=N key=K`.
fn row_line(row: &outbox_row::Model) -> String {
    format!("id={} key={}", row.id, row.idempotency_key)
}

/// Prints the summary line and returns the summary.
fn finish(summary: RetrySummary, out: &mut impl Write) -> anyhow::Result<RetrySummary> {
    writeln!(
        out,
        "requeued={} linked={} skipped={} errors={}",
        summary.requeued, summary.linked, summary.skipped, summary.errors
    )?;
    Ok(summary)
}

/// Why the operator's `user_id` must not be linked to the student of create-user `row`, if
/// it must not: the row's old key created another user, or Users does not hold `user_id`
/// as a user of this student (or cannot be asked).
async fn why_not_link(
    users: &UsersClient,
    row: &outbox_row::Model,
    user_id: Uuid,
    student: &str,
) -> Option<String> {
    if let Some(answered) = old_key_created_another(users, row, user_id).await {
        return Some(answered);
    }
    match unless_shed(|| users.get_user(user_id)).await {
        Err(status) => Some(cannot_ask(&format!("about user={user_id}"), &status)),
        Ok(None) => Some(format!("Users has no user {user_id}")),
        Ok(Some(user)) if user.student_id != student => Some(format!(
            "user={user_id} belongs to student {}, not {student}",
            user.student_id
        )),
        Ok(Some(_)) => None,
    }
}

/// What an operator must do with an expired row: Users no longer keeps the old key, so
/// neither it nor this tool can tell from the key whether the effect took place. For a
/// create-user row that matters (a new key would be a second operation), so `--new-key`
/// looks at the student's users first; a change is safe under a new key.
fn expired_advice(row: &outbox_row::Model) -> String {
    const UNKNOWABLE: &str =
        "expired; Users no longer keeps keys this old, so it cannot tell whether this one ran.";
    match row.operation() {
        Some(Operation::CreatesTheUser) => format!(
            "{UNKNOWABLE} Use --new-key: it links the student's user if Users holds one, and \
             gives a new key if it holds none"
        ),
        Some(Operation::ChangesTheLinkedUser) | None => format!(
            "{UNKNOWABLE} Use --new-key: Users applies each student version at most once, so \
             a new key cannot apply version {} twice",
            row.aggregate_version
        ),
    }
}

/// Asks Users, replay-only (it can never execute), what the row's key got.
pub(crate) async fn ask_about_old_key(
    users: &UsersClient,
    row: &outbox_row::Model,
) -> Result<OldKey, String> {
    let effect = Effect::decode(&row.effect_type, &row.payload)
        .map_err(|err| format!("{err}, so Users cannot be asked about the old key"))?;
    let (trace, span) = row_trace(row);
    let exported = delivery_span(row, trace);
    let asked = unless_shed(|| {
        users
            .deliver(Key::of(row, trace), &effect, None, true)
            .instrument(span.clone())
    });
    match exported.ended(asked.await) {
        Ok(answer) => Ok(OldKey::Executed(Delivered::of(&effect, answer.user_id))),
        Err(status)
            if status.code() == Code::NotFound
                && platform::status::reason(&status).as_deref() == Some("NOT_IN_INBOX") =>
        {
            Ok(OldKey::NothingKnown)
        }
        Err(status) if platform::status::reason(&status).as_deref() == Some(DELIVERY_EXPIRED) => {
            Ok(OldKey::NothingKnown)
        }
        // The key's saved answer is a rejection: nothing was created under it.
        Err(status) if was_replayed(&status) => Ok(OldKey::NothingKnown),
        Err(status) => Err(cannot_ask("about the old key", &status)),
    }
}
