//! Running the real binaries (`student-svc`, `users-svc`, `relay`) as processes: building
//! them, starting them with their output captured, waiting for health, signalling them.
//! `cargo run -p devstack` uses it to start the whole system; the end-to-end tests use it
//! to start, kill and restart processes.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use nix::{sys::signal::Signal, unistd::Pid};
use tonic::transport::ClientTlsConfig;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The binaries of the system.
pub const BINARIES: [&str; 3] = ["student-svc", "users-svc", "relay"];

/// Builds the three binaries (and `migrate`) with cargo (an up-to-date build is a no-op)
/// and returns the directory that holds them. Cargo does not build another package's
/// binaries for a test, so the tests call this instead of trusting whatever binary happens
/// to be on disk.
/// `features` are cargo features such as `relay/failpoints`.
pub fn build_binaries(release: bool, features: &[&str]) -> anyhow::Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("devstack lives inside the workspace")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--quiet", "--bins"]);
    // `cargo run` and `cargo test` give their process the CARGO_PKG_NAME, CARGO_MANIFEST_DIR,
    // … of the crate they run; passed on, they change the fingerprint of `ring`'s build
    // script (it watches them), so every crate above it was rebuilt by each `loadgen` run
    // and again by the next outer build (minutes each).
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_a_crate) {
            command.env_remove(name);
        }
    }
    // And `migrate`, the schema tool (package `migrations`), which the tests run too.
    for package in BINARIES.iter().chain(&["migrations"]) {
        command.args(["-p", package]);
    }
    if release {
        command.arg("--release");
    }
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let status = command.status().context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build of {BINARIES:?} failed: {status}");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    Ok(target.join(if release { "release" } else { "debug" }))
}

/// Whether `name` is one of the variables cargo sets for the crate it builds or runs
/// (<https://doc.rust-lang.org/cargo/reference/environment-variables.html>), as opposed to
/// the ones that configure cargo itself (`CARGO_TARGET_DIR`, `CARGO_HOME`, …).
fn set_by_cargo_for_a_crate(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&name)
}

/// A running binary whose stderr (its log) is copied to a file and watched for the line
/// that announces its listening address.
pub struct Process {
    name: String,
    child: Child,
    log_path: PathBuf,
    addr: Option<SocketAddr>,
    addr_rx: mpsc::Receiver<SocketAddr>,
    /// The thread copying stderr to the log; joined once the process has ended, so that
    /// everything it wrote is in the file before anyone reads it.
    log_copier: Option<std::thread::JoinHandle<()>>,
    /// How it ended, once reaped: its pid may then belong to another process.
    ended: Option<ExitStatus>,
}

/// Which environment a started binary sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Environment {
    /// This process's environment plus the given variables (devstack: the user's
    /// `USERS_AUTH_TOKEN`, TLS paths and so on are meant to reach the binaries).
    Inherited,
    /// Only `PATH` plus the given variables (tests: nothing a developer exported, such as
    /// `USERS_AUTH_TOKEN`, `FAILPOINTS` or `RUST_LOG`, leaks into a test's processes).
    Clean,
}

impl Process {
    /// Starts `binary` with `args` and `envs`, logging to `log_path` (appended, so a
    /// restarted process keeps one log). It shares this process's group, so an interrupted
    /// test run takes it down too.
    pub fn spawn(
        binary: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_path: &Path,
    ) -> anyhow::Result<Self> {
        Self::start(binary, args, envs, log_path, false, Environment::Inherited)
    }

    /// Like [`Process::spawn`], but the binary sees only `PATH` and `envs`: nothing
    /// inherited from whoever runs the tests.
    pub fn spawn_isolated(
        binary: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_path: &Path,
    ) -> anyhow::Result<Self> {
        Self::start(binary, args, envs, log_path, false, Environment::Clean)
    }

    /// Like [`Process::spawn`], but in a process group of its own, so a Ctrl-C in the
    /// terminal reaches only the caller, which then stops its children in order.
    pub fn spawn_in_own_group(
        binary: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_path: &Path,
    ) -> anyhow::Result<Self> {
        Self::start(binary, args, envs, log_path, true, Environment::Inherited)
    }

    fn start(
        binary: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_path: &Path,
        own_group: bool,
        environment: Environment,
    ) -> anyhow::Result<Self> {
        let name = binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let mut command = Command::new(binary);
        if own_group {
            command.process_group(0);
        }
        if environment == Environment::Clean {
            command.env_clear();
            if let Some(path) = std::env::var_os("PATH") {
                command.env("PATH", path);
            }
        }
        let mut child = command
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stderr = child.stderr.take().context("stderr is piped")?;
        let (addr_tx, addr_rx) = mpsc::channel();
        // The pipe must be drained for as long as the process lives, or it blocks on a full
        // pipe; a thread copies every line to the log file.
        let log_copier = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = listening_addr(&line) {
                    let _ = addr_tx.send(addr);
                }
                let _ = writeln!(log, "{line}");
            }
        });
        Ok(Self {
            name,
            child,
            log_path: log_path.to_owned(),
            addr: None,
            addr_rx,
            log_copier: Some(log_copier),
            ended: None,
        })
    }

    /// The process's name (its binary's file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its operating-system process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its log is written.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Waits for the address the process logs once it listens.
    pub fn listening_addr(&mut self, timeout: Duration) -> anyhow::Result<SocketAddr> {
        if let Some(addr) = self.addr {
            return Ok(addr);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.addr_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(addr) => {
                    self.addr = Some(addr);
                    return Ok(addr);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{} exited before listening; see {}",
                        self.name,
                        self.log_path.display()
                    )
                }
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited with {status} before listening; see {}",
                    self.name,
                    self.log_path.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not listen within {timeout:?}; see {}",
                    self.name,
                    self.log_path.display()
                );
            }
        }
    }

    /// Sends a signal: SIGKILL for a crash, SIGTERM for a polite stop. Refused once the
    /// process has ended and been reaped, when its pid may belong to another process. (Until
    /// this handle reaps it, an ended process stays a zombie that keeps its pid.)
    pub fn signal(&mut self, signal: Signal) -> anyhow::Result<()> {
        if let Some(status) = self.try_wait()? {
            bail!(
                "{} already ended ({status}); not sending {signal}",
                self.name
            );
        }
        let pid = i32::try_from(self.child.id()).context("pid out of range")?;
        nix::sys::signal::kill(Pid::from_raw(pid), signal)
            .with_context(|| format!("cannot send {signal} to {}", self.name))
    }

    /// Kills the process with SIGKILL (no chance to clean up, like a crash) and reaps it.
    pub fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(Signal::SIGKILL)?;
        let status = self.child.wait()?;
        Ok(self.ended(status))
    }

    /// Returns the exit status if the process has ended.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if let Some(status) = self.ended {
            return Ok(Some(status));
        }
        Ok(self.child.try_wait()?.map(|status| self.ended(status)))
    }

    /// Waits up to `timeout` for the process to end by itself.
    pub fn wait_timeout(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records how the process ended and waits for its last log lines to reach the file.
    fn ended(&mut self, status: ExitStatus) -> ExitStatus {
        self.ended = Some(status);
        if let Some(copier) = self.log_copier.take() {
            // The pipe closed with the process, so the copier ends as soon as it has
            // written what was left.
            let _ = copier.join();
        }
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.try_wait() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.ended(status);
            }
        }
    }
}

/// Extracts `ADDR` from the line a server logs once it listens: `… listening addr=ADDR` in
/// text, or a JSON line (`--log-format json`) whose message says `listening` and whose
/// `addr` field is `ADDR`.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    if line.starts_with('{') {
        let fields: serde_json::Value = serde_json::from_str(line).ok()?;
        return fields["addr"].as_str()?.parse().ok();
    }
    let rest = &line[line.find("addr=")? + "addr=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Waits until the gRPC health service at `addr` reports `service` as SERVING.
pub async fn wait_until_serving(
    addr: SocketAddr,
    service: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until_serving_over(addr, service, timeout, None).await
}

/// Like [`wait_until_serving`], over TLS when given a client configuration.
pub async fn wait_until_serving_over(
    addr: SocketAddr,
    service: &str,
    timeout: Duration,
    tls: Option<&ClientTlsConfig>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::new();
    while Instant::now() < deadline {
        match check_health(addr, service, tls).await {
            Ok(ServingStatus::Serving) => return Ok(()),
            Ok(status) => last_error = format!("status {status:?}"),
            Err(err) => last_error = format!("{err:#}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{service} at {addr} not SERVING within {timeout:?}: {last_error}")
}

async fn check_health(
    addr: SocketAddr,
    service: &str,
    tls: Option<&ClientTlsConfig>,
) -> anyhow::Result<ServingStatus> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .connect_timeout(Duration::from_secs(1));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    let channel = endpoint.connect().await?;
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(response.into_inner().status())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README: devstack passes your environment on (a `USERS_AUTH_TOKEN` exported in the
    /// shell reaches the binaries), while a test's processes see only `PATH` and what the
    /// test gives them. (Cargo sets `CARGO_MANIFEST_DIR` for this test's process.)
    #[test]
    fn devstacks_binaries_inherit_the_environment_and_isolated_ones_do_not() {
        let inherited = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
        let dir = std::env::temp_dir().join(format!("devstack-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let script = [
            "-c".to_owned(),
            "echo \"manifest=$CARGO_MANIFEST_DIR given=$GIVEN\" >&2".to_owned(),
        ];
        let given = [("GIVEN".to_owned(), "yes".to_owned())];
        let shell = Path::new("/bin/sh");
        for (name, own_group) in [("devstack", true), ("isolated", false)] {
            let log = dir.join(format!("{name}.log"));
            let mut process = if own_group {
                Process::spawn_in_own_group(shell, &script, &given, &log)
            } else {
                Process::spawn_isolated(shell, &script, &given, &log)
            }
            .expect("start sh");
            let status = process
                .wait_timeout(Duration::from_secs(10))
                .expect("wait")
                .expect("sh ends");
            assert!(status.success());
            let line = std::fs::read_to_string(&log).expect("its log");
            let expected = if own_group {
                format!("manifest={inherited} given=yes\n")
            } else {
                "manifest= given=yes\n".to_owned()
            };
            assert_eq!(line, expected, "{name}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_listening_line_yields_the_address() {
        let line = "2026-11-30T14:20:53.907653Z  INFO listening: student-svc listening addr=127.0.0.1:50051";
        assert_eq!(
            listening_addr(line),
            Some("127.0.0.1:50051".parse().expect("addr"))
        );
        assert_eq!(listening_addr("INFO relay running users_url=x"), None);
        let json = r#"{"level":"INFO","message":"users-svc listening","addr":"127.0.0.1:50052"}"#;
        assert_eq!(
            listening_addr(json),
            Some("127.0.0.1:50052".parse().expect("addr"))
        );
    }
}
