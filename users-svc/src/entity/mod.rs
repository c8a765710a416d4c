//! The Users DB's tables as sea-orm entities.

pub mod inbox;
pub mod users;
