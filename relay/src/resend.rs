//! `relay resend --student S`: after the Users DB was restored from an older backup, sends
//! one student's delivered rows again, so that Users gets back what the restore undid.
//!
//! `relay audit` names such students: linked to a user Users does not have (created after
//! the backup), or whose user is behind the version Users had applied (changed after it).
//! Users is asked first, and the rows go back only for what it truly lost: the user (every
//! row, the link cleared, so that the create-user row creates and links it again) or the
//! changes after the user's version. Their keys stay (see `student_store::resend`).

use std::io::Write;

use sea_orm::DatabaseConnection;
use student_store::{
    audit::state_now,
    effect::CREATE_USER,
    entity::outbox::OutboxStatus,
    outbox::rows_of_student,
    resend::{self, Lost, Resent},
    students,
};
use uuid::Uuid;

use platform::status::code_name;

use crate::{
    retry_failed::{OldKey, ask_about_old_key},
    users_client::{UsersClient, unless_shed},
};

/// Resends what Users lost of `student`, printing one line; returns the exit code: 0 when
/// rows went back, 1 when there was nothing to resend or it was refused (the line says why).
/// Users not answering is an error (the caller exits 2).
pub async fn resend(
    db: &DatabaseConnection,
    users: &UsersClient,
    student: Uuid,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let (Some(link), Some(state)) = (
        students::linked_user(db, student).await?,
        state_now(db, student).await?,
    ) else {
        writeln!(
            out,
            "student {student}: not a linked student; nothing Users could have lost"
        )?;
        return Ok(1);
    };
    let (lost, what) = match what_users_lost(db, users, student, link, state.synced_version).await?
    {
        Ok(found) => found,
        Err(refusal) => {
            writeln!(out, "student {student}: {refusal}; nothing changed")?;
            return Ok(1);
        }
    };
    match resend::resend(db, student, link, lost).await? {
        Resent::Requeued(ids) => {
            let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
            writeln!(
                out,
                "student {student}: {what}; requeued with their keys: rows {}",
                ids.join(" ")
            )?;
            Ok(0)
        }
        Resent::InFlight => {
            writeln!(
                out,
                "student {student}: a row of it is being delivered; nothing changed, resend once \
                 it is done"
            )?;
            Ok(1)
        }
        Resent::LinkChanged => {
            writeln!(
                out,
                "student {student}: its link changed meanwhile; nothing changed"
            )?;
            Ok(1)
        }
    }
}

/// What Users lost of `student` (linked to `link`, `synced` the version Users had applied),
/// and how to say so; or why nothing is to be resent.
async fn what_users_lost(
    db: &DatabaseConnection,
    users: &UsersClient,
    student: Uuid,
    link: Uuid,
    synced: i64,
) -> anyhow::Result<Result<(Lost, String), String>> {
    let asking = |what: &str, status: tonic::Status| {
        anyhow::anyhow!(
            "cannot ask Users {what}: {}: {}",
            code_name(status.code()),
            status.message()
        )
    };
    let listed = unless_shed(|| users.list_users(student))
        .await
        .map_err(|status| asking(&format!("for student {student}'s users"), status))?;
    if let Some(user) = listed.iter().find(|user| user.id == link.to_string()) {
        let version = i64::try_from(user.source_version).unwrap_or(i64::MAX);
        return Ok(if version < synced {
            Ok((
                Lost::ChangesAfter(version),
                format!(
                    "user {link} in Users is at version {version}, behind version {synced} that \
                     Users had applied"
                ),
            ))
        } else {
            Err(format!(
                "user {link} in Users is at version {version}, not behind version {synced} that \
                 Users had applied: Users lost nothing of it"
            ))
        });
    }
    if !listed.is_empty() {
        let ids: Vec<&str> = listed.iter().map(|user| user.id.as_str()).collect();
        return Ok(Err(format!(
            "Users holds other users of it ({}), not its linked user {link}: a resend would \
             create one more",
            ids.join(", ")
        )));
    }
    if let Some(user) = unless_shed(|| users.get_user(link))
        .await
        .map_err(|status| asking(&format!("about user {link}"), status))?
    {
        return Ok(Err(format!(
            "its linked user {link} belongs to student {} in Users",
            user.student_id
        )));
    }
    // The user is gone. Its create-user row's key must be gone from the inbox too (restored
    // with it), or sent again it would be answered with the lost user, not create one.
    let rows = rows_of_student(db, student).await?;
    let Some(create) = rows
        .iter()
        .find(|row| row.effect_type == CREATE_USER && row.status == OutboxStatus::Done)
    else {
        return Ok(Err(format!(
            "user {link} is not in Users, and no delivered create-user row can create it again"
        )));
    };
    match ask_about_old_key(users, create).await {
        Err(problem) => Err(anyhow::anyhow!(problem)),
        Ok(OldKey::Executed(answered)) => Ok(Err(format!(
            "user {link} is not in Users, but its inbox still answers the create-user row's key \
             with user {}: sent again, the row would link that user, not create one",
            answered.user_id()
        ))),
        Ok(OldKey::NothingKnown) => Ok(Ok((
            Lost::User,
            format!("user {link} is not in Users: link cleared"),
        ))),
    }
}
