//! The project's integration tests, one binary: each scenario runs on SQLite and, when
//! `TEST_POSTGRES_URL` is set, on PostgreSQL, with its own databases and ports.

mod support;

mod api_contract;
mod concurrency;
mod configuration;
mod crash_matrix;
mod create_users;
mod hostile_input;
mod leases;
mod loadgen_running;
mod operations;
mod processes;
mod redrive;
mod reflection;
mod relay_claims;
mod relay_delivery;
mod security;
mod student_changes;
mod student_service;
mod traces;
mod upgrades;
mod user_changes;
mod users_service;
