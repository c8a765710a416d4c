//! `relay resend`'s one write: a student's delivered rows put back to `pending`, with their
//! own keys, after the Users DB lost what they did there (restored from an older backup).
//!
//! The keys stay: Users executed them in a history its restore undid, and its inbox (restored
//! with it) no longer holds them, so each runs again, once. They are dated now, so that
//! Users' horizon guard does not take an old key it no longer holds for one it purged.

use platform::db::{begin_write, now};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    sea_query::Expr,
};
use uuid::Uuid;

use crate::{
    effect::CREATE_USER,
    entity::{
        outbox::{self, OutboxStatus},
        students,
    },
    outbox::back_to_pending,
};

/// What Users lost of one student.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The linked user itself: every delivered row goes back, the create-user row first, and
    /// the link is cleared with them, so that the user Users creates again is linked.
    User,
    /// The changes after this version (the user's in Users): those go back.
    ChangesAfter(i64),
}

/// What became of a resend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resent {
    /// The rows are `pending` again.
    Requeued,
    /// A row of the student waits or is being delivered: nothing changed (sent before the
    /// rows that go back, it would reach Users out of order).
    Busy,
    /// The student's link or recorded version, or its delivered rows, are no longer what
    /// the resend was judged on: nothing changed.
    Changed,
}

/// Puts back to `pending` the `done` rows `ids` of `student`, which must be exactly its
/// `done` rows that `lost` names, in one transaction with the student's link and
/// `synced_version` set to what Users holds now (no link and 0 when the user is lost, else
/// the user's version). Judged on the student linked to `link` with `synced` recorded: if
/// either changed, or a row of the student is `pending` or `processing`, nothing changes.
///
/// The student row is updated first: its lock keeps the student's changes (which update
/// it too) from adding a row until the commit, and the check for undelivered rows comes
/// after it, so no row of the student can be claimed and sent ahead of the ones going back.
pub async fn resend(
    db: &DatabaseConnection,
    student: Uuid,
    (link, synced): (Uuid, i64),
    lost: Lost,
    ids: &[i64],
) -> Result<Resent, DbErr> {
    let txn = begin_write(db).await?;
    let (user_id, synced_version) = match lost {
        Lost::User => (None, 0),
        Lost::ChangesAfter(version) => (Some(link), version),
    };
    let judged = students::Entity::update_many()
        .col_expr(students::Column::UserId, Expr::value(user_id))
        .col_expr(students::Column::SyncedVersion, Expr::value(synced_version))
        .filter(students::Column::Id.eq(student))
        .filter(students::Column::UserId.eq(link))
        .filter(students::Column::SyncedVersion.eq(synced))
        .exec(&txn)
        .await?;
    if judged.rows_affected != 1 {
        return Ok(Resent::Changed);
    }
    let undelivered = outbox::Entity::find()
        .filter(outbox::Column::AggregateId.eq(student))
        .filter(outbox::Column::Status.is_in([OutboxStatus::Pending, OutboxStatus::Processing]))
        .count(&txn)
        .await?;
    if undelivered > 0 {
        return Ok(Resent::Busy);
    }
    let mut rows = outbox::Entity::find()
        .filter(outbox::Column::AggregateId.eq(student))
        .filter(outbox::Column::Status.eq(OutboxStatus::Done));
    if let Lost::ChangesAfter(version) = lost {
        rows = rows
            .filter(outbox::Column::EffectType.ne(CREATE_USER))
            .filter(outbox::Column::AggregateVersion.gt(version));
    }
    let found: Vec<i64> = rows
        .order_by_asc(outbox::Column::Id)
        .all(&txn)
        .await?
        .into_iter()
        .map(|row| row.id)
        .collect();
    if found != ids {
        return Ok(Resent::Changed);
    }
    let requeued = back_to_pending(outbox::Entity::update_many(), db.get_database_backend())
        .col_expr(outbox::Column::KeyCreatedAt, Expr::value(Some(now())))
        .col_expr(
            outbox::Column::DeliveredUserId,
            Expr::value(Option::<String>::None),
        )
        .filter(outbox::Column::Id.is_in(ids.iter().copied()))
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .exec(&txn)
        .await?;
    // A purge may have deleted one since it was read (PostgreSQL reads committed rows).
    if requeued.rows_affected != ids.len() as u64 {
        return Ok(Resent::Changed);
    }
    txn.commit().await?;
    Ok(Resent::Requeued)
}
