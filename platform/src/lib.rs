//! What `student-svc`, `users-svc` and `relay` share and must do the same way: opening a
//! database (SQLite or PostgreSQL) and its write transactions, validating request fields,
//! fingerprinting requests, serving gRPC with health and reflection, logging, building the
//! services' Tokio runtime, shutting down.
//! It owns no data and no business rule.

pub mod db;
pub mod failpoint;
pub mod fingerprint;
pub mod group_commit;
pub mod grpc_server;
pub mod log_writer;
pub mod metrics;
pub mod otlp;
pub mod overload;
pub mod redact;
pub mod retention;
pub mod runtime;
pub mod shutdown;
pub mod status;
pub mod telemetry;
pub mod timestamp;
pub mod trace;
pub mod validate;
