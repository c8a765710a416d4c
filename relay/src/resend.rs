//! `relay resend --student S`: after the Users DB was restored from an older backup, sends
//! one student's delivered rows again, so that Users gets back what the restore undid.
//!
//! `relay audit` names such students: linked to a user Users does not have (created after
//! the backup), or whose user is behind the version Users had applied (changed after it).
//! Users is asked first, and the rows go back only for what it truly lost: the user (every
//! row, the link cleared, so that the create-user row creates and links it again) or the
//! changes after the user's version. Every one of those versions must still have its row
//! (`relay purge` deletes old ones), and Users' inbox must hold none of their keys (it
//! would answer them, not run them: a user deleted by hand is no restore). Their keys stay
//! (see `student_store::resend`).

use std::io::Write;

use sea_orm::DatabaseConnection;
use student_store::{
    audit::state_now,
    effect::Operation,
    entity::outbox::{self as outbox_row, OutboxStatus},
    outbox::rows_of_student,
    resend::{self, Lost, Resent},
    students,
};
use uuid::Uuid;

use crate::{
    retry_failed::{OldKey, ask_about_old_key},
    users_client::{UsersClient, cannot_ask, unless_shed},
};

/// What a resend did for one student.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Resent,
    /// Users lost nothing of it (or it is not linked).
    NothingLost,
    Refused,
}

/// Totals of `relay resend --all`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub resent: u64,
    pub refused: u64,
    pub unchanged: u64,
}

impl Summary {
    /// 0 when no student was refused, 1 when some were (errors exit 2 before a summary).
    pub fn exit_code(self) -> u8 {
        u8::from(self.refused > 0)
    }
}

/// Resends what Users lost of `student`, printing one line; returns the exit code: 0 when
/// rows went back, 1 when there was nothing to resend or it was refused (the line says why).
/// Users not answering is an error (the caller exits 2).
pub async fn resend(
    db: &DatabaseConnection,
    users: &UsersClient,
    student: Uuid,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let (outcome, line) = judge_and_resend(db, users, student).await?;
    writeln!(out, "{line}")?;
    Ok(u8::from(outcome != Outcome::Resent))
}

/// Resends what Users lost of every linked student, in pages as `relay audit` reads them:
/// one line per student resent or refused (none for the others), then
/// `resent=N refused=N unchanged=N`.
pub async fn resend_all(
    db: &DatabaseConnection,
    users: &UsersClient,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut after = None;
    loop {
        // Linked students only: one resent (unlinked) lies behind the page, never ahead.
        let page = student_store::audit::linked_students_page(db, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(*last);
        for student in page {
            let (outcome, line) = judge_and_resend(db, users, student).await?;
            match outcome {
                Outcome::Resent => summary.resent += 1,
                Outcome::Refused => summary.refused += 1,
                Outcome::NothingLost => {
                    summary.unchanged += 1;
                    continue;
                }
            }
            writeln!(out, "{line}")?;
        }
    }
    writeln!(
        out,
        "resent={} refused={} unchanged={}",
        summary.resent, summary.refused, summary.unchanged
    )?;
    Ok(summary)
}

/// Why a student with a row waiting or in flight is not resent: sent before the rows going
/// back, it would reach Users out of order.
const BUSY: &str = "a row of it waits or is being delivered; resend once it is delivered";

/// Students read at a time by `--all`.
const PAGE: u64 = 500;

/// Judges what Users lost of `student` and sends it again: what came of it, and its line.
async fn judge_and_resend(
    db: &DatabaseConnection,
    users: &UsersClient,
    student: Uuid,
) -> anyhow::Result<(Outcome, String)> {
    let (Some(link), Some(state)) = (
        students::linked_user(db, student).await?,
        state_now(db, student).await?,
    ) else {
        return Ok((
            Outcome::NothingLost,
            format!("student {student}: not a linked student; nothing Users could have lost"),
        ));
    };
    let synced = state.synced_version;
    let refused = |why: &str| {
        (
            Outcome::Refused,
            format!("student {student}: {why}; nothing changed"),
        )
    };
    let (lost, what) = match what_users_lost(users, student, link, synced).await? {
        Judged::Lost(lost, what) => (lost, what),
        Judged::NothingLost(why) => {
            return Ok((
                Outcome::NothingLost,
                format!("student {student}: {why}; nothing changed"),
            ));
        }
        Judged::Refused(why) => return Ok(refused(&why)),
    };
    let rows = match rows_to_send(db, users, student, lost, synced).await? {
        Ok(rows) => rows,
        Err(why) => return Ok(refused(&why)),
    };
    let mut ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    ids.sort_unstable();
    Ok(
        match resend::resend(db, student, (link, synced), lost, &ids).await? {
            Resent::Requeued => {
                let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
                (
                    Outcome::Resent,
                    format!(
                        "student {student}: {what}; requeued with their keys: rows {}",
                        ids.join(" ")
                    ),
                )
            }
            Resent::Busy => refused(BUSY),
            Resent::Changed => {
                refused("it changed meanwhile (its link, its versions or its rows); look again")
            }
        },
    )
}

/// What Users says it lost of a student.
enum Judged {
    /// This, said so.
    Lost(Lost, String),
    /// Nothing, and why.
    NothingLost(String),
    /// Something a resend must not repair, and why.
    Refused(String),
}

/// What Users lost of `student` (linked to `link`, `synced` the version Users had applied),
/// and how to say so; or why nothing is to be resent.
async fn what_users_lost(
    users: &UsersClient,
    student: Uuid,
    link: Uuid,
    synced: i64,
) -> anyhow::Result<Judged> {
    let listed = unless_shed(|| users.list_users(student))
        .await
        .map_err(|status| asking(&format!("for student {student}'s users"), &status))?;
    if let Some(user) = listed.iter().find(|user| user.id == link.to_string()) {
        let version = i64::try_from(user.source_version).unwrap_or(i64::MAX);
        return Ok(if version < synced {
            Judged::Lost(
                Lost::ChangesAfter(version),
                format!(
                    "user {link} in Users is at version {version}, behind version {synced} that \
                     Users had applied"
                ),
            )
        } else {
            Judged::NothingLost(format!(
                "user {link} in Users is at version {version}, not behind version {synced} that \
                 Users had applied: Users lost nothing of it"
            ))
        });
    }
    if !listed.is_empty() {
        let ids: Vec<&str> = listed.iter().map(|user| user.id.as_str()).collect();
        return Ok(Judged::Refused(format!(
            "Users holds other users of it ({}), not its linked user {link}: a resend would \
             create one more",
            ids.join(", ")
        )));
    }
    if let Some(user) = unless_shed(|| users.get_user(link))
        .await
        .map_err(|status| asking(&format!("about user {link}"), &status))?
    {
        return Ok(Judged::Refused(format!(
            "its linked user {link} belongs to student {} in Users",
            user.student_id
        )));
    }
    Ok(Judged::Lost(
        Lost::User,
        format!("user {link} is not in Users: link cleared"),
    ))
}

/// The delivered rows of `student` that carry what Users lost, oldest first: one for every
/// lost version (the create-user row is version 1), each with a key Users' inbox does not
/// hold; or why they cannot be sent again.
async fn rows_to_send(
    db: &DatabaseConnection,
    users: &UsersClient,
    student: Uuid,
    lost: Lost,
    synced: i64,
) -> anyhow::Result<Result<Vec<outbox_row::Model>, String>> {
    let (first, what_for) = match lost {
        Lost::User => (1, "create the user again"),
        Lost::ChangesAfter(version) => (version + 1, "change it again"),
    };
    let all = rows_of_student(db, student).await?;
    if all
        .iter()
        .any(|row| matches!(row.status, OutboxStatus::Pending | OutboxStatus::Processing))
    {
        return Ok(Err(BUSY.to_owned()));
    }
    let rows: Vec<outbox_row::Model> = all
        .into_iter()
        .filter(|row| row.status == OutboxStatus::Done)
        .filter(|row| match lost {
            Lost::User => true,
            // The changes of the versions Users lost; its user is still there.
            Lost::ChangesAfter(version) => match row.operation() {
                Some(Operation::CreatesTheUser) => false,
                Some(Operation::ChangesTheLinkedUser) | None => row.aggregate_version > version,
            },
        })
        .collect();
    if lost == Lost::User
        && !rows
            .iter()
            .any(|row| row.operation() == Some(Operation::CreatesTheUser))
    {
        return Ok(Err(
            "no delivered create-user row is left (purged) to create the user again".to_owned(),
        ));
    }
    let missing: Vec<String> = (first..=synced)
        .filter(|version| !rows.iter().any(|row| row.aggregate_version == *version))
        .map(|version| version.to_string())
        .collect();
    if !missing.is_empty() {
        return Ok(Err(format!(
            "no delivered row is left of versions {} (relay purge deletes them), so nothing \
             can {what_for} as it was",
            missing.join(" ")
        )));
    }
    for row in &rows {
        match ask_about_old_key(users, row).await {
            Err(problem) => return Err(anyhow::anyhow!(problem)),
            Ok(OldKey::Executed(answered)) => {
                return Ok(Err(format!(
                    "Users' inbox still answers the key of row {} (user {}): that is no restore, \
                     and sent again the row would be answered, not run",
                    row.id,
                    answered.user_id()
                )));
            }
            Ok(OldKey::NothingKnown) => {}
        }
    }
    Ok(Ok(rows))
}

fn asking(what: &str, status: &tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(cannot_ask(what, status))
}
