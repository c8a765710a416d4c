//! The Student database, for everyone who works on it: `student-svc` (students, and the
//! effects on Users their changes decide) and the `relay` (delivering those effects).
//!
//! It owns the tables ([`entity`]), the effects and their payloads ([`effect`]), the outbox
//! status values, the LISTEN channel and how writers ring it ([`wake`]), and every write: the student transactions
//! ([`students`]) and the relay's claims and state changes ([`outbox`]), each one statement
//! or one short transaction, opened and committed in one visible place. What clients see
//! of a student's link is computed in [`sync`].

pub mod audit;
pub mod effect;
pub mod entity;
mod finish_many;
pub mod outbox;
pub mod resend;
pub mod students;
pub mod sync;
pub mod wake;

/// The PostgreSQL channel notified when an outbox row commits; relays LISTEN on it.
pub const OUTBOX_CHANNEL: &str = "outbox_created";
