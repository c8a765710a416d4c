//! The relay: delivers the Student DB's outbox to the Users service. It reads `pending`
//! rows, calls `CreateUser` (or `CreateUsers` for many rows at once) with each row's stored
//! idempotency key (never holding a
//! transaction open across the call), then links the returned user to the student and
//! marks the row `done` in one Student-DB transaction. It also replays past deliveries
//! (`relay replay`) and reports the outbox (`relay status`).
//!
//! The relay is part of Student's side: it reads and writes the Student DB and talks to
//! Users only over gRPC.

pub mod audit;
mod backoff;
mod budget;
pub mod classify;
pub mod cli;
mod config;
mod deliver;
mod deliver_many;
mod finalize;
pub mod metrics;
mod pipeline;
pub mod replay;
pub mod resend;
pub mod retry_failed;
pub mod show;
mod startup;
pub mod status;
#[cfg(test)]
mod test_rows;
pub mod users_client;
pub mod wakeup;

pub use config::RunConfig;
pub use deliver::{BatchOutcome, Relay};
pub use startup::open_when_ready;
