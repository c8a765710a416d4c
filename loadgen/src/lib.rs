//! `loadgen`: the tool behind every number in BENCHMARKS.md. It starts the three release
//! binaries itself on fresh databases (SQLite, or PostgreSQL through a maintenance URL), or
//! measures a system already running (`--student-url`), drives CreateStudent, reads link
//! latency from the rows' own timestamps, reads each process's CPU time and peak memory,
//! and measures the database-only ceiling in the same run. `--json PATH` writes everything
//! it printed. A library too, so the integration tests drive it against a running system.

mod ceiling;
mod claim_cost;
mod load;
mod replay_cost;
mod rows;
mod runs;
mod stats;
pub mod suite;
mod system;
mod targets;
