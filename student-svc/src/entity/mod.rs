//! The Student DB's tables as sea-orm entities. Shared with the relay, which works on the
//! same database.

pub mod outbox;
pub mod students;
