//! The Users service (`users.v1.UsersService`). It owns the Users DB: `users` and the
//! `inbox` that makes CreateUser, UpdateUser and DisableUser idempotent, so a redelivered
//! request returns the answer of the first execution instead of executing again. Nobody
//! else reads or writes this database.

pub mod answer_cache;
mod api;
pub mod auth;
pub mod change_user;
pub mod create_user;
pub mod create_users;
pub mod entity;
mod error;
pub mod inbox;
pub mod inspect;
pub mod listing;
pub mod metrics;
mod new_user;
pub mod retention;

use std::net::SocketAddr;

use platform::grpc_server::{ServerOptions, ServiceDefinition};
use proto::users::v1::users_service_server::UsersServiceServer;
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::{Routes, interceptor::InterceptedService};

pub use api::UsersApi;
use auth::{AcceptedTokens, RequireToken};
pub use error::Error;
pub use new_user::NewUser;

/// Largest request message accepted, in bytes; larger ones get OUT_OF_RANGE.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Command-line and environment configuration of `users-svc`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "users-svc", about = "The Users gRPC service", version)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "USERS_LISTEN_ADDR", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
    /// Users DB: `sqlite://PATH?mode=rwc` or `postgres://USER@HOST/DB`.
    #[arg(
        long,
        env = "USERS_DATABASE_URL",
        default_value = "sqlite://data/users.db?mode=rwc"
    )]
    pub database_url: String,
    /// A request still running after this is cancelled.
    #[arg(long, env = "USERS_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: std::time::Duration,
    /// Most connections to the Users DB (on PostgreSQL each counts against the server's
    /// `max_connections`; see the README for sizing).
    #[arg(long, env = "USERS_DB_MAX_CONNECTIONS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub db_max_connections: u32,
    /// Threads that run requests: 1 (the default) runs the whole service on one thread,
    /// which cost less CPU per request and served more under load on a 2-core box shared
    /// with the database, while two gave lower latency at moderate load (BENCHMARKS-JOURNAL.md,
    /// "One thread per service"); give it more on a box with cores to spare.
    #[arg(long, env = "USERS_WORKER_THREADS", default_value = "1")]
    pub worker_threads: std::num::NonZeroUsize,
    /// Requests in flight at once; more are answered RESOURCE_EXHAUSTED at once. Sized for
    /// four relays at their default --concurrency (128 each).
    #[arg(long, env = "USERS_MAX_CONCURRENT_REQUESTS", default_value_t = 512)]
    pub max_concurrent_requests: usize,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, env = "USERS_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "USERS_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off when unset; port 0 picks one).
    #[arg(long, env = "USERS_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Log lines as `text` or `json` (JSON lines carry `trace_id` as a field).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: platform::telemetry::LogFormat,
    /// Require `authorization: Bearer <token>` on every UsersService call (16 bytes or more).
    /// A comma-separated list accepts each of them, to rotate a token with no failed call.
    #[arg(long, env = "USERS_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// How long the inbox keeps an executed key (and its saved answer). Keep it longer than
    /// any caller may retry or redrive a key: older keys it does not have are refused as
    /// DELIVERY_EXPIRED rather than executed again.
    #[arg(long, env = "USERS_INBOX_RETENTION", default_value = "30d", value_parser = humantime::parse_duration)]
    pub inbox_retention: std::time::Duration,
    /// How often the server deletes inbox entries past --inbox-retention.
    #[arg(long, env = "USERS_INBOX_PURGE_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub inbox_purge_interval: std::time::Duration,
    /// How many recent inbox answers the server keeps in memory, so a repeated key is
    /// answered without reading the database (0 turns this off). Never outlives
    /// --inbox-retention; about 200 bytes per key.
    #[arg(long, env = "USERS_INBOX_CACHE_ENTRIES", default_value_t = DEFAULT_INBOX_CACHE_ENTRIES)]
    pub inbox_cache_entries: usize,
    /// Serve (no subcommand), or inspect the Users DB and exit.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// One-shot commands on the Users DB (`--database-url` / `USERS_DATABASE_URL`).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// The inbox of executed idempotency keys.
    Inbox {
        #[command(subcommand)]
        action: InboxCommand,
    },
}

/// What to do with the inbox.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum InboxCommand {
    /// Delete the entries older than --inbox-retention now, in batches; prints `purged=N`.
    Purge,
    /// Print the saved fingerprint, answer and time of one key (exit 1 if it is unknown).
    Show {
        /// The idempotency key (a relay's outbox row key).
        #[arg(long)]
        key: String,
    },
}

impl Config {
    /// The tokens callers must present one of, if any are configured (refused if one is
    /// too short).
    pub fn auth_tokens(&self) -> anyhow::Result<Option<AcceptedTokens>> {
        self.auth_token
            .as_deref()
            .map(AcceptedTokens::parse)
            .transpose()
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

/// Opens the Users DB (a pool of at most `max_connections`) and brings its schema up to
/// date.
pub async fn open_database(url: &str, max_connections: u32) -> anyhow::Result<DatabaseConnection> {
    migrations::open::<migrations::users::Migrator>(url, max_connections).await
}

/// Recent inbox answers a server keeps in memory unless told otherwise.
pub const DEFAULT_INBOX_CACHE_ENTRIES: usize = 10_000;

/// How long the inbox keeps keys, how often it is purged, and how many recent answers the
/// server keeps in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxSettings {
    pub retention: std::time::Duration,
    pub purge_interval: std::time::Duration,
    /// See [`answer_cache`]; 0 turns the cache off.
    pub cache_entries: usize,
}

impl Default for InboxSettings {
    /// The flags' defaults: keys kept 30 days, purged hourly.
    fn default() -> Self {
        Self {
            retention: std::time::Duration::from_secs(30 * 24 * 3600),
            purge_interval: std::time::Duration::from_secs(3600),
            cache_entries: DEFAULT_INBOX_CACHE_ENTRIES,
        }
    }
}

impl Config {
    /// The inbox retention these flags ask for.
    pub fn inbox(&self) -> InboxSettings {
        InboxSettings {
            retention: self.inbox_retention,
            purge_interval: self.inbox_purge_interval,
            cache_entries: self.inbox_cache_entries,
        }
    }
}

/// Serves the Users service on `listener` until `shutdown` is cancelled, purging the inbox
/// on schedule.
pub async fn run(
    listener: TcpListener,
    db: DatabaseConnection,
    options: ServerOptions,
    auth_tokens: Option<AcceptedTokens>,
    inbox: InboxSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    retention::warn_if_shorter_than_retries(inbox.retention);
    let purging = db.clone();
    tokio::spawn(platform::retention::on_schedule(
        "inbox entries",
        inbox.purge_interval,
        shutdown.clone(),
        move || {
            let db = purging.clone();
            async move { retention::purge_expired(&db, inbox.retention).await }
        },
    ));
    let answers = answer_cache::AnswerCache::new(inbox.cache_entries, inbox.retention);
    let service = UsersServiceServer::new(UsersApi::new(db.clone(), inbox.retention, answers))
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let service = InterceptedService::new(service, RequireToken(auth_tokens));
    let definition = ServiceDefinition {
        routes: Routes::new(service),
        name: "users.v1.UsersService",
        file_descriptor_set: proto::users::v1::FILE_DESCRIPTOR_SET,
    };
    platform::grpc_server::serve(listener, definition, options, db, shutdown).await
}
