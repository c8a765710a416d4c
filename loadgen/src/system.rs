//! The system under measurement: the three release binaries started by loadgen on fresh
//! databases (SQLite files, or new PostgreSQL databases), or a system already running.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use devstack::{Process, build_binaries, wait_until_serving};
use nix::sys::signal::Signal;
use platform::telemetry::LISTENING_TARGET;
use sea_orm::{ConnectionTrait as _, Database};
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, ClientTlsConfig, Endpoint},
};

use crate::stats::ProcessCost;

/// Where the databases live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// SQLite files in a directory of loadgen's.
    Sqlite,
    /// New databases created through this maintenance URL, dropped afterwards.
    Postgres { admin_url: String },
    /// A system somebody else started: loadgen starts, stops and drops nothing.
    Running(Box<Running>),
}

/// Where a system's services answer and its databases are: one loadgen started, or one
/// somebody else runs.
#[derive(Debug, Clone)]
pub struct Running {
    /// student-svc, for CreateStudent.
    pub student: Endpoint,
    /// Read for link latency (the outbox rows' own timestamps).
    pub student_database_url: String,
    /// users-svc, for `replay-cost`.
    pub users: Option<Endpoint>,
    /// For `open`'s two stages (the inbox rows' timestamps).
    pub users_database_url: Option<String>,
    /// `authorization` for users-svc, if it asks for a token (a running system's); marked
    /// sensitive, so printing a `Running` never shows it.
    pub users_authorization: Option<MetadataValue<Ascii>>,
}

impl Running {
    /// From the command line's URLs: `http://HOST:PORT` (plaintext) or `https://HOST:PORT`
    /// for the services, TLS checked against the CA certificate in `tls_ca` (PEM) or,
    /// without one, the system's roots.
    pub fn from_urls(
        student_url: &str,
        student_database_url: Option<&str>,
        users_url: Option<&str>,
        users_database_url: Option<&str>,
        users_auth_token: Option<&str>,
        tls_ca: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let student_database_url = student_database_url
            .context("--student-url needs --student-database-url: link latency is read from the outbox rows")?
            .to_owned();
        let ca = match tls_ca {
            Some(path) => {
                let https = |url: &str| url.starts_with("https://");
                anyhow::ensure!(
                    https(student_url) || users_url.is_some_and(https),
                    "--tls-ca is for services reached at https:// URLs"
                );
                Some(
                    std::fs::read(path)
                        .with_context(|| format!("cannot read --tls-ca {}", path.display()))?,
                )
            }
            None => None,
        };
        Ok(Self {
            student: endpoint(student_url, ca.as_deref())?,
            student_database_url,
            users: users_url
                .map(|url| endpoint(url, ca.as_deref()))
                .transpose()?,
            users_database_url: users_database_url.map(str::to_owned),
            users_authorization: users_auth_token.map(bearer).transpose()?,
        })
    }
}

/// `Bearer TOKEN`, as a header value that debug output never shows.
fn bearer(token: &str) -> anyhow::Result<MetadataValue<Ascii>> {
    let mut value = MetadataValue::try_from(format!("Bearer {token}"))
        .context("the Users token is not a valid header value")?;
    value.set_sensitive(true);
    Ok(value)
}

/// How loadgen reaches the service at `url`: `http://HOST:PORT` in plaintext, or
/// `https://HOST:PORT` over TLS, trusting the CA certificate `ca_pem` or, without one, the
/// system's roots. Connections are made when a mode first calls.
pub fn endpoint(url: &str, ca_pem: Option<&[u8]>) -> anyhow::Result<Endpoint> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("{url}: not a URL"))?
        .tcp_nodelay(true);
    if url.starts_with("http://") {
        return Ok(endpoint);
    }
    anyhow::ensure!(
        url.starts_with("https://"),
        "{url}: expected http://HOST:PORT or https://HOST:PORT"
    );
    let tls = match ca_pem {
        Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    endpoint
        .tls_config(tls)
        .with_context(|| format!("{url}: TLS settings"))
}

/// A pair of fresh, empty databases.
pub struct Databases {
    pub student_url: String,
    pub users_url: String,
    dir: PathBuf,
    postgres: Option<(String, [String; 2])>,
}

impl Databases {
    /// Creates them (SQLite: files appear on first use).
    pub async fn create(backend: &Backend) -> anyhow::Result<Self> {
        let admin_url = match backend {
            Backend::Running(_) => {
                anyhow::bail!("this measurement makes fresh databases: not with --student-url")
            }
            Backend::Sqlite => None,
            Backend::Postgres { admin_url } => Some(admin_url),
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("loadgen-{}", &id[..12]));
        std::fs::create_dir_all(&dir)?;
        match admin_url {
            None => {
                let url = |name: &str| format!("sqlite://{}/{name}.db?mode=rwc", dir.display());
                Ok(Self {
                    student_url: url("student"),
                    users_url: url("users"),
                    dir,
                    postgres: None,
                })
            }
            Some(admin_url) => {
                let names = [
                    format!("bench_student_{}", &id[..12]),
                    format!("bench_users_{}", &id[..12]),
                ];
                let admin = Database::connect(admin_url.as_str())
                    .await
                    .context("connect to the PostgreSQL maintenance URL")?;
                for name in &names {
                    admin
                        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
                        .await?;
                }
                admin.close().await.ok();
                let base = admin_url
                    .rsplit_once('/')
                    .map_or(admin_url.as_str(), |(base, _)| base);
                Ok(Self {
                    student_url: format!("{base}/{}", names[0]),
                    users_url: format!("{base}/{}", names[1]),
                    dir,
                    postgres: Some((admin_url.clone(), names)),
                })
            }
        }
    }

    /// The directory for this run's logs and SQLite files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Drops the PostgreSQL databases and removes the directory.
    pub async fn remove(self) {
        if let Some((admin_url, names)) = &self.postgres
            && let Ok(admin) = Database::connect(admin_url.as_str()).await
        {
            for name in names {
                let _ = admin
                    .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            }
            admin.close().await.ok();
        }
        if std::env::var_os("LOADGEN_KEEP_LOGS").is_some() {
            eprintln!("  logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// How to run the system.
#[derive(Debug, Clone)]
pub struct Options {
    /// Relays to start with (more can be started later).
    pub relays: usize,
    /// `outbox` or `direct` (student-svc `--link-mode`).
    pub link_mode: String,
    /// Extra environment for every binary (`RELAY_*` tuning, connection budgets…).
    pub env: Vec<(String, String)>,
}

/// The system under measurement: the three binaries on fresh databases, started here, or
/// one already running.
pub struct System {
    /// Where its services answer and its databases are.
    pub running: Running,
    started: Option<Started>,
}

/// What loadgen started, and stops and removes again.
struct Started {
    databases: Databases,
    users_url: String,
    bin: PathBuf,
    users: Process,
    student: Process,
    relays: Vec<Process>,
    env: Vec<(String, String)>,
}

impl System {
    /// Builds the release binaries (a no-op when up to date), starts users-svc and
    /// student-svc, waits until both are healthy, and starts `options.relays` relays; or,
    /// for [`Backend::Running`], connects to nothing yet and starts nothing (its relays, if
    /// any, are its own).
    pub async fn start(backend: &Backend, options: &Options) -> anyhow::Result<Self> {
        if let Backend::Running(running) = backend {
            return Ok(Self {
                running: Running::clone(running),
                started: None,
            });
        }
        let bin = build_binaries(true, &[])?;
        let databases = Databases::create(backend).await?;
        let env = environment(options);
        let mut users = spawn(
            &bin,
            &databases,
            "users-svc",
            &[
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &databases.users_url,
            ],
            &env,
        )?;
        let users_addr = users.listening_addr(Duration::from_secs(60))?;
        wait_until_serving(users_addr, "users.v1.UsersService", Duration::from_secs(60)).await?;
        let users_url = format!("http://{users_addr}");
        let mut student = spawn(
            &bin,
            &databases,
            "student-svc",
            &[
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &databases.student_url,
                "--link-mode",
                &options.link_mode,
                "--users-url",
                &users_url,
            ],
            &env,
        )?;
        let student_addr = student.listening_addr(Duration::from_secs(60))?;
        wait_until_serving(
            student_addr,
            "student.v1.StudentService",
            Duration::from_secs(60),
        )
        .await?;
        let mut system = Self {
            running: Running {
                student: endpoint(&format!("http://{student_addr}"), None)?,
                student_database_url: databases.student_url.clone(),
                users: Some(endpoint(&users_url, None)?),
                users_database_url: Some(databases.users_url.clone()),
                users_authorization: None,
            },
            started: Some(Started {
                databases,
                users_url,
                bin,
                users,
                student,
                relays: Vec::new(),
                env,
            }),
        };
        system.start_relays(options.relays)?;
        Ok(system)
    }

    /// Starts `count` more relays (`relay run` with the tuning in the environment).
    pub fn start_relays(&mut self, count: usize) -> anyhow::Result<()> {
        let Some(started) = &mut self.started else {
            anyhow::ensure!(
                count == 0,
                "a running system's relays are its own: loadgen starts none"
            );
            return Ok(());
        };
        for _ in 0..count {
            let relay = spawn(
                &started.bin,
                &started.databases,
                "relay",
                &[
                    "--database-url",
                    &started.databases.student_url,
                    "--users-url",
                    &started.users_url,
                    "run",
                ],
                &started.env,
            )?;
            started.relays.push(relay);
        }
        Ok(())
    }

    /// What each process loadgen started has cost so far (read while they run); nothing
    /// for a running system, whose processes loadgen does not know.
    pub fn costs(&self) -> Vec<ProcessCost> {
        let Some(started) = &self.started else {
            return Vec::new();
        };
        let mut costs: Vec<ProcessCost> = [
            ("users-svc", &started.users),
            ("student-svc", &started.student),
        ]
        .into_iter()
        .filter_map(|(name, process)| ProcessCost::read(name, process.pid()))
        .collect();
        costs.extend(
            started
                .relays
                .iter()
                .enumerate()
                .filter_map(|(n, relay)| ProcessCost::read(&format!("relay-{n}"), relay.pid())),
        );
        costs
    }

    /// Stops every process loadgen started (SIGTERM, then SIGKILL after 10 s) and removes
    /// its databases; a running system is left as it was.
    pub async fn stop(self) {
        let Some(mut started) = self.started else {
            return;
        };
        let processes = started
            .relays
            .iter_mut()
            .chain([&mut started.student, &mut started.users]);
        for process in processes {
            let _ = process.signal(Signal::SIGTERM);
            if !matches!(process.wait_timeout(Duration::from_secs(10)), Ok(Some(_))) {
                let _ = process.kill();
            }
        }
        started.databases.remove().await;
    }
}

/// The environment of every binary loadgen starts for `options`, in order: a later entry
/// for the same name wins.
fn environment(options: &Options) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if options.link_mode == "direct" {
        // The baseline at its best: direct's requests wait on a call to Users in their
        // middle, and both services completed more of them per second on two threads than
        // on the one the outbox flow runs on by default (BENCHMARKS-JOURNAL.md, "One thread
        // per service"). `--env` can still say otherwise.
        for name in ["STUDENT_WORKER_THREADS", "USERS_WORKER_THREADS"] {
            env.push((name.to_owned(), "2".to_owned()));
        }
    }
    env.extend(options.env.iter().cloned());
    // Every binary logs at info, as deployed by default, unless `--env RUST_LOG=…` says
    // otherwise. Whatever it says, the line a service logs once it listens stays on:
    // loadgen learns each service's port from it (`devstack::Process::listening_addr`).
    let filter = match effective(&env, "RUST_LOG") {
        Some(asked) => format!("{asked},{LISTENING_TARGET}=info"),
        None => "info".to_owned(),
    };
    env.push(("RUST_LOG".into(), filter));
    env
}

/// The value a binary ends up with for `name`: the last entry for it.
fn effective<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn spawn(
    bin: &Path,
    databases: &Databases,
    name: &str,
    args: &[&str],
    env: &[(String, String)],
) -> anyhow::Result<Process> {
    let log = databases.dir().join(format!(
        "{name}-{}.log",
        uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .get(..6)
            .unwrap_or_default()
    ));
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    Process::spawn_isolated(&bin.join(name), &args, env, &log)
        .with_context(|| format!("start {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_system_never_prints_its_users_token() {
        let running = Running::from_urls(
            "http://127.0.0.1:50051",
            Some("sqlite::memory:"),
            Some("http://127.0.0.1:50052"),
            None,
            Some("secret-token-0123456789"),
            None,
        )
        .unwrap();
        let printed = format!("{:?}", Backend::Running(Box::new(running)));
        assert!(printed.contains("users_authorization"), "{printed}");
        assert!(!printed.contains("secret-token"), "{printed}");
    }

    fn options(link_mode: &str, env: &[(&str, &str)]) -> Options {
        Options {
            relays: 1,
            link_mode: link_mode.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn direct_runs_on_two_threads_unless_told_otherwise() {
        let direct = environment(&options("direct", &[]));
        assert_eq!(effective(&direct, "STUDENT_WORKER_THREADS"), Some("2"));
        assert_eq!(effective(&direct, "USERS_WORKER_THREADS"), Some("2"));
        let told = environment(&options("direct", &[("STUDENT_WORKER_THREADS", "1")]));
        assert_eq!(effective(&told, "STUDENT_WORKER_THREADS"), Some("1"));
        let outbox = environment(&options("outbox", &[]));
        assert_eq!(effective(&outbox, "STUDENT_WORKER_THREADS"), None);
        assert_eq!(effective(&outbox, "RUST_LOG"), Some("info"));
    }

    #[test]
    fn a_quieter_log_level_keeps_the_line_that_gives_the_port() {
        let quiet = environment(&options("outbox", &[("RUST_LOG", "warn")]));
        assert_eq!(effective(&quiet, "RUST_LOG"), Some("warn,listening=info"));
    }
}
