//! The Student DB's tables as sea-orm entities.

pub mod outbox;
pub mod students;
