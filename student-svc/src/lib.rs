//! The Student service (`student.v1.StudentService`). It owns the Student DB: `students`
//! and the `outbox` of effects on other services. CreateStudent commits a student together
//! with the `create-user` outbox row that asks Users for its login user; the `relay`
//! delivers that row later. This service never calls Users itself.

mod api;
pub mod direct;
mod error;
mod new_student;
pub mod students;
pub mod writer;

use std::net::SocketAddr;

use anyhow::Context as _;
use direct::{DirectUsers, LinkMode};
use platform::grpc_server::{ServerOptions, ServiceDefinition};
use proto::student::v1::student_service_server::StudentServiceServer;
use sea_orm::DatabaseConnection;
use student_store::wake::{RelayBell, WakeRelays};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

pub use api::{Link, StudentApi};
pub use error::Error;
pub use new_student::{NewStudent, StudentChange};

/// Largest request message accepted, in bytes; larger ones get OUT_OF_RANGE.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Command-line and environment configuration of `student-svc`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "student-svc", about = "The Student gRPC service", version)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "STUDENT_LISTEN_ADDR", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Student DB: `sqlite://PATH?mode=rwc` or `postgres://USER@HOST/DB`.
    #[arg(
        long,
        env = "STUDENT_DATABASE_URL",
        default_value = "sqlite://data/student.db?mode=rwc"
    )]
    pub database_url: String,
    /// A request still running after this is cancelled.
    #[arg(long, env = "STUDENT_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: std::time::Duration,
    /// Most connections to the Student DB (on PostgreSQL each counts against the server's
    /// `max_connections`; see the README for sizing).
    #[arg(long, env = "STUDENT_DB_MAX_CONNECTIONS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub db_max_connections: u32,
    /// Threads that run requests: 1 (the default) runs the whole service on one thread,
    /// which cost less CPU per request and served more under load on a 2-core box shared
    /// with the database, while two gave lower latency at moderate load (BENCHMARKS-JOURNAL.md,
    /// "One thread per service"); give it more on a box with cores to spare.
    #[arg(long, env = "STUDENT_WORKER_THREADS", default_value = "1")]
    pub worker_threads: std::num::NonZeroUsize,
    /// Requests in flight at once; more are answered RESOURCE_EXHAUSTED at once.
    #[arg(long, env = "STUDENT_MAX_CONCURRENT_REQUESTS", default_value_t = 256)]
    pub max_concurrent_requests: usize,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, env = "STUDENT_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "STUDENT_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off when unset; port 0 picks one).
    #[arg(long, env = "STUDENT_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Log lines as `text` or `json` (JSON lines carry `trace_id` as a field).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: platform::telemetry::LogFormat,
    /// How CreateStudent gets the login user: `outbox` (the design) or `direct` (calls
    /// Users itself: the naive baseline and anti-pattern, for benchmarks only).
    #[arg(long, env = "STUDENT_LINK_MODE", value_enum, default_value_t = LinkMode::Outbox)]
    pub link_mode: LinkMode,
    /// Users, for `--link-mode direct` only (`https://…` for TLS).
    #[arg(long, env = "USERS_URL", default_value = "http://127.0.0.1:50052")]
    pub users_url: String,
    /// PEM CA certificate to trust for an `https://` Users URL (`--link-mode direct`).
    #[arg(long, env = "USERS_TLS_CA")]
    pub users_ca: Option<std::path::PathBuf>,
    /// Bearer token for Users (`--link-mode direct`).
    #[arg(long, env = "USERS_AUTH_TOKEN", hide_env_values = true)]
    pub users_auth_token: Option<String>,
    /// How a new outbox row wakes the relays on PostgreSQL: `after-commit` (a coalesced
    /// `NOTIFY` once the transaction committed), `in-transaction` (a `NOTIFY` inside it;
    /// PostgreSQL then commits notifying transactions one at a time) or `off` (relays
    /// poll). Ignored on SQLite.
    #[arg(long, env = "STUDENT_WAKE_RELAYS", default_value = "after-commit")]
    pub wake_relays: WakeRelays,
}

impl Config {
    /// How CreateStudent will get its login user (reads the Users CA file if given).
    pub fn link(&self) -> anyhow::Result<Link> {
        match self.link_mode {
            LinkMode::Outbox => Ok(Link::Outbox),
            LinkMode::Direct => {
                let ca = self
                    .users_ca
                    .as_deref()
                    .map(|path| {
                        std::fs::read(path)
                            .with_context(|| format!("cannot read {}", path.display()))
                    })
                    .transpose()?;
                let users = DirectUsers::new(
                    &self.users_url,
                    ca,
                    self.users_auth_token.as_deref(),
                    self.request_timeout,
                )?;
                Ok(Link::Direct(Box::new(users)))
            }
        }
    }

    /// The server options this configuration asks for (reads the TLS files).
    pub fn server_options(&self) -> anyhow::Result<ServerOptions> {
        ServerOptions::from_flags(
            self.request_timeout,
            self.max_concurrent_requests,
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )
    }
}

/// Opens the Student DB (a pool of at most `max_connections`) and brings its schema up to
/// date.
pub async fn open_database(url: &str, max_connections: u32) -> anyhow::Result<DatabaseConnection> {
    migrations::open::<migrations::student::Migrator>(url, max_connections).await
}

/// Serves the Student service on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    db: DatabaseConnection,
    options: ServerOptions,
    link: Link,
    wake: WakeRelays,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let bell = RelayBell::new(&db, wake);
    let service = StudentServiceServer::new(StudentApi::new(db.clone(), link, bell))
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let definition = ServiceDefinition {
        routes: Routes::new(service),
        name: "student.v1.StudentService",
        file_descriptor_set: proto::student::v1::FILE_DESCRIPTOR_SET,
    };
    platform::grpc_server::serve(listener, definition, options, db, shutdown).await
}
