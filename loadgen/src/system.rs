//! The system under measurement: the three release binaries started by loadgen on fresh
//! databases (SQLite files, or new PostgreSQL databases), or a system already running.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use devstack::{Process, build_binaries, wait_until_serving};
use nix::sys::signal::Signal;
use sea_orm::{ConnectionTrait as _, Database};

use crate::stats::ProcessCost;

/// Where the databases live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// SQLite files in a directory of loadgen's.
    Sqlite,
    /// New databases created through this maintenance URL, dropped afterwards.
    Postgres { admin_url: String },
    /// A system somebody else started: loadgen starts, stops and drops nothing.
    Running(Running),
}

/// Where a system's services answer and its databases are: one loadgen started, or one
/// somebody else runs.
#[derive(Debug, Clone)]
pub struct Running {
    pub student_addr: SocketAddr,
    /// Read for link latency (the outbox rows' own timestamps).
    pub student_database_url: String,
    /// For `replay-cost`.
    pub users_addr: Option<SocketAddr>,
    /// For `open`'s two stages (the inbox rows' timestamps).
    pub users_database_url: Option<String>,
}

impl Running {
    /// From the command line's URLs: `http://HOST:PORT` for the services (plaintext).
    pub async fn resolve(
        student_url: &str,
        student_database_url: Option<&str>,
        users_url: Option<&str>,
        users_database_url: Option<&str>,
    ) -> anyhow::Result<Self> {
        let student_database_url = student_database_url
            .context("--student-url needs --student-database-url: link latency is read from the outbox rows")?
            .to_owned();
        let users_addr = match users_url {
            Some(url) => Some(address(url).await?),
            None => None,
        };
        Ok(Self {
            student_addr: address(student_url).await?,
            student_database_url,
            users_addr,
            users_database_url: users_database_url.map(str::to_owned),
        })
    }
}

/// The first address `http://HOST:PORT` resolves to.
async fn address(url: &str) -> anyhow::Result<SocketAddr> {
    let host_port = url
        .strip_prefix("http://")
        .with_context(|| format!("{url}: expected http://HOST:PORT (loadgen speaks plaintext)"))?
        .trim_end_matches('/');
    tokio::net::lookup_host(host_port)
        .await
        .with_context(|| format!("cannot resolve {host_port}"))?
        .next()
        .with_context(|| format!("{host_port} resolves to no address"))
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
                running: running.clone(),
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
                student_addr,
                student_database_url: databases.student_url.clone(),
                users_addr: Some(users_addr),
                users_database_url: Some(databases.users_url.clone()),
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
        // on the one the outbox flow runs on by default (BENCHMARKS.md, "One thread per
        // service"). `--env` can still say otherwise.
        for name in ["STUDENT_WORKER_THREADS", "USERS_WORKER_THREADS"] {
            env.push((name.to_owned(), "2".to_owned()));
        }
    }
    env.extend(options.env.iter().cloned());
    // As deployed by default: every binary logs at info.
    env.push(("RUST_LOG".into(), "info".into()));
    env
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

    /// What each binary ends up with: the last entry for a name.
    fn effective(env: &[(String, String)], name: &str) -> Option<String> {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn direct_runs_on_two_threads_unless_told_otherwise() {
        let direct = environment(&options("direct", &[]));
        assert_eq!(
            effective(&direct, "STUDENT_WORKER_THREADS").as_deref(),
            Some("2")
        );
        assert_eq!(
            effective(&direct, "USERS_WORKER_THREADS").as_deref(),
            Some("2")
        );
        let told = environment(&options("direct", &[("STUDENT_WORKER_THREADS", "1")]));
        assert_eq!(
            effective(&told, "STUDENT_WORKER_THREADS").as_deref(),
            Some("1")
        );
        let outbox = environment(&options("outbox", &[]));
        assert_eq!(effective(&outbox, "STUDENT_WORKER_THREADS"), None);
        assert_eq!(effective(&outbox, "RUST_LOG").as_deref(), Some("info"));
    }
}
