//! The reads behind ListUsers: one student's users, or every user a page at a time.

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    Select,
};
use uuid::Uuid;

use crate::entity::users;

/// Every user of `student_id`, enabled or not, oldest first (through
/// `users_student_id_idx`; a student has one user, rarely a few).
pub async fn users_of_student(
    db: &DatabaseConnection,
    student_id: Uuid,
) -> Result<Vec<users::Model>, DbErr> {
    users_of_student_query(student_id).all(db).await
}

/// The statement of [`users_of_student`] (its plan is checked by a test).
pub fn users_of_student_query(student_id: Uuid) -> Select<users::Entity> {
    users::Entity::find()
        .filter(users::Column::StudentId.eq(student_id))
        .order_by_asc(users::Column::CreatedAt)
        .order_by_asc(users::Column::Id)
}

/// One page of every user, in id order.
pub struct Page {
    pub users: Vec<users::Model>,
    /// The id to continue after, when there are more.
    pub next_after: Option<Uuid>,
}

/// Up to `limit` users whose id comes after `after`, in id order (the primary key's).
/// Users never deletes a user, so paging from the last id seen misses none that existed
/// when the first page was read.
pub async fn page(db: &DatabaseConnection, after: Option<Uuid>, limit: u64) -> Result<Page, DbErr> {
    let mut query = users::Entity::find().order_by_asc(users::Column::Id);
    if let Some(after) = after {
        query = query.filter(users::Column::Id.gt(after));
    }
    // One more than asked tells whether another page exists.
    let mut users = query.limit(limit + 1).all(db).await?;
    let has_more = users.len() as u64 > limit;
    users.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_after = if has_more {
        users.last().map(|user| user.id)
    } else {
        None
    };
    Ok(Page { users, next_after })
}
