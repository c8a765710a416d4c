//! The Student DB's tables as sea-orm entities.

pub mod outbox;
pub mod students;
pub mod unchanged_keys;
