//! The three real binaries as processes on this test's databases and ports, to be killed,
//! crashed at fail points and restarted like in production.

use std::{
    net::SocketAddr,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{ExitStatus, Output},
    sync::OnceLock,
    time::Duration,
};

use devstack::{Process, wait_until_serving};
use nix::sys::signal::Signal;
use proto::{
    student::v1::student_service_client::StudentServiceClient,
    users::v1::users_service_client::UsersServiceClient,
};
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
};
use student_store::entity::{outbox, students};
use tonic::transport::Channel;

use super::{Backend, TestDatabases, proxy::Proxy};

const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a backlog of a few hundred students may take to drain on a loaded CI machine.
pub const LINK_DEADLINE: Duration = Duration::from_secs(90);

/// What a relay logs while the Student DB has no schema yet.
pub const RELAY_WAITS_FOR_THE_SCHEMA: &str =
    "student-svc has not created the Student DB schema yet";

/// Short leases and deadlines, so crash recovery takes seconds in tests.
pub const RELAY_TUNING: &[&str] = &[
    "--poll-interval",
    "50ms",
    "--backoff-base",
    "50ms",
    "--backoff-max",
    "500ms",
    "--call-timeout",
    "1s",
    "--lease",
    "2s",
];

/// For a relay whose call must reach a fail point armed in Users (a crash at its commit).
/// The call's deadline travels with it and Users drops a call whose deadline has passed,
/// so with [`RELAY_TUNING`]'s 1 s a commit stalled by a loaded machine could end the call
/// before Users reaches the fail point, which then never fires. A Users that dies still
/// fails the call at once: its connection closes.
pub const CALLS_OUTLAST_A_STALL: &[&str] = &["--call-timeout", "20s", "--lease", "40s"];

/// Builds the binaries, with fail points compiled in, once per test run.
pub fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let features = [
            "student-svc/failpoints",
            "users-svc/failpoints",
            "relay/failpoints",
        ];
        devstack::build_binaries(!cfg!(debug_assertions), &features).expect("build the binaries")
    })
}

/// `users-svc`, `student-svc` and relays running against one test's databases.
///
/// Clients and relays reach each service through a [`Proxy`] the test owns, so a service
/// restarts on a fresh port while its address stays the same for the whole test.
pub struct Stack {
    /// `RUST_LOG` of every process this stack starts.
    pub log_filter: String,
    pub users: Process,
    pub student: Process,
    pub relays: Vec<Process>,
    /// Relays started so far: each logs to its own `relay-N.log`.
    relays_started: usize,
    /// The stable addresses (the proxies); the processes behind them change on restarts.
    pub users_addr: SocketAddr,
    pub student_addr: SocketAddr,
    users_proxy: Proxy,
    student_proxy: Proxy,
    pub student_db: DatabaseConnection,
    pub users_db: DatabaseConnection,
    // Dropped last, after every process and connection.
    pub dbs: TestDatabases,
}

impl Stack {
    /// Starts Users, then one relay (before the Student DB has a schema: it must say it
    /// waits), then Student; returns once both services are healthy.
    pub async fn start(backend: Backend) -> Option<Self> {
        Self::start_logging(backend, "info").await
    }

    /// Like [`Stack::start`], with `RUST_LOG=log_filter` for every process.
    pub async fn start_logging(backend: Backend, log_filter: &str) -> Option<Self> {
        Self::start_with(backend, log_filter, &[]).await
    }

    /// Like [`Stack::start`], every process serving Prometheus metrics on a port of its
    /// own (see [`Stack::metrics_addr`]).
    pub async fn start_with_metrics(backend: Backend) -> Option<Self> {
        Self::start_with(backend, "info", &["--metrics-addr", "127.0.0.1:0"]).await
    }

    /// Starts the stack with `extra` flags for all three binaries (the relay's after `run`).
    async fn start_with(backend: Backend, log_filter: &str, extra: &[&str]) -> Option<Self> {
        let dbs = TestDatabases::create(backend).await?;
        let (users_proxy, student_proxy) = (Proxy::start().await, Proxy::start().await);
        let users = start_service(&dbs, log_filter, "users-svc", &users_proxy, None, extra).await;
        let relay = spawn_relay(
            &dbs,
            &dbs.student_url,
            log_filter,
            0,
            users_proxy.addr(),
            None,
            extra,
        );
        // The README's "the three binaries start in any order": the relay is running, and
        // waits, before the Student DB has a schema (a relay that went on to claim would
        // not say this, and its claims would fail).
        wait_for_log_lines(&dbs, "relay-0", RELAY_WAITS_FOR_THE_SCHEMA, 1).await;
        let student =
            start_service(&dbs, log_filter, "student-svc", &student_proxy, None, extra).await;
        let student_db = platform::db::connect(&dbs.student_url)
            .await
            .expect("Student DB");
        let users_db = platform::db::connect(&dbs.users_url)
            .await
            .expect("Users DB");
        Some(Self {
            log_filter: log_filter.to_owned(),
            users,
            student,
            relays: vec![relay],
            relays_started: 1,
            users_addr: users_proxy.addr(),
            student_addr: student_proxy.addr(),
            users_proxy,
            student_proxy,
            student_db,
            users_db,
            dbs,
        })
    }

    /// A client of the student-svc process.
    pub fn student_client(&self) -> StudentServiceClient<Channel> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.student_addr))
                .expect("endpoint")
                .connect_lazy();
        StudentServiceClient::new(channel)
    }

    /// A client of the users-svc process (no token).
    pub fn users_client(&self) -> UsersServiceClient<Channel> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.users_addr))
                .expect("endpoint")
                .connect_lazy();
        UsersServiceClient::new(channel)
    }

    /// Fails the test if a process that should be running has exited.
    pub fn assert_running(&mut self) {
        let processes = [&mut self.users, &mut self.student]
            .into_iter()
            .chain(self.relays.iter_mut());
        for process in processes {
            if let Ok(Some(status)) = process.try_wait() {
                panic!("{} exited with {status}", process.name());
            }
        }
    }

    /// Sends SIGTERM to every process, relays first, and returns how each ended (`None`:
    /// still running after `timeout`). Once a process has ended, its log file is complete.
    pub fn terminate_all(&mut self, timeout: Duration) -> Vec<(String, Option<ExitStatus>)> {
        self.signal_all(Signal::SIGTERM, timeout)
    }

    /// Sends `signal` to every process, relays first, and returns how each ended, as
    /// [`Stack::terminate_all`] does.
    pub fn signal_all(
        &mut self,
        signal: Signal,
        timeout: Duration,
    ) -> Vec<(String, Option<ExitStatus>)> {
        let processes = self
            .relays
            .iter_mut()
            .chain([&mut self.student, &mut self.users]);
        processes
            .map(|process| {
                process.signal(signal).expect("signal");
                let status = process.wait_timeout(timeout).expect("wait");
                (process.name().to_owned(), status)
            })
            .collect()
    }

    /// Kills every relay with SIGKILL, as a crash would.
    pub fn kill_relays(&mut self) {
        for mut relay in self.relays.drain(..) {
            relay.kill().expect("kill relay");
        }
    }

    /// Stops every relay with SIGTERM and asserts each exits 0 within `timeout`.
    pub fn stop_relays(&mut self, timeout: Duration) {
        for mut relay in self.relays.drain(..) {
            relay.signal(Signal::SIGTERM).expect("SIGTERM");
            let status = relay
                .wait_timeout(timeout)
                .expect("wait")
                .unwrap_or_else(|| panic!("relay still running {timeout:?} after SIGTERM"));
            assert!(status.success(), "relay exited with {status} after SIGTERM");
        }
    }

    /// Starts one more relay, with `failpoints` armed (`FAILPOINTS` syntax) if given, and
    /// extra `run` flags (later flags override the test tuning).
    pub fn start_relay(&mut self, failpoints: Option<&str>, extra: &[&str]) {
        let url = self.dbs.student_url.clone();
        self.start_relay_at(&url, failpoints, extra);
    }

    /// Starts one more relay whose connections PostgreSQL shows as `application_name`
    /// `name` (given in its database URL, which overrides the program's own name).
    pub fn start_relay_named(&mut self, name: &str) {
        let url = &self.dbs.student_url;
        let separator = if url.contains('?') { '&' } else { '?' };
        self.start_relay_at(
            &format!("{url}{separator}application_name={name}"),
            None,
            &[],
        );
    }

    fn start_relay_at(&mut self, database_url: &str, failpoints: Option<&str>, extra: &[&str]) {
        self.relays.push(spawn_relay(
            &self.dbs,
            database_url,
            &self.log_filter,
            self.relays_started,
            self.users_addr,
            failpoints,
            extra,
        ));
        self.relays_started += 1;
    }

    /// Replaces every relay with one whose calls outlast a stalled commit in Users
    /// ([`CALLS_OUTLAST_A_STALL`]), with `extra` flags after those.
    pub fn start_relay_for_a_users_crash(&mut self, extra: &[&str]) {
        self.kill_relays();
        self.start_relay(None, &[CALLS_OUTLAST_A_STALL, extra].concat());
    }

    /// Starts one more relay whose claim's create-user rows reach Users together, in one
    /// CreateUsers call: up to 16 rows a call, and calls that outlast a stalled machine
    /// ([`CALLS_OUTLAST_A_STALL`]: rows whose call timed out would each be sent again after
    /// a backoff of their own, apart).
    pub fn start_relay_sending_together(&mut self) {
        self.start_relay(
            None,
            &[CALLS_OUTLAST_A_STALL, &["--rows-per-call", "16"]].concat(),
        );
    }

    /// Waits for relay `index` to die at an armed `abort` fail point.
    pub fn wait_for_relay_abort(&mut self, index: usize) {
        let status = self.relays[index]
            .wait_timeout(START_TIMEOUT)
            .expect("wait")
            .expect("the relay aborts");
        assert_aborted("relay", status);
        self.relays.remove(index);
    }

    /// Kills users-svc with SIGKILL; until it is restarted, calls to it are refused.
    pub fn kill_users(&mut self) {
        self.users_proxy.clear_backend();
        self.users.kill().expect("kill users-svc");
    }

    /// Starts users-svc again (on a fresh port, behind the same address), optionally with
    /// fail points armed.
    pub async fn restart_users(&mut self, failpoints: Option<&str>) {
        self.restart_users_with(failpoints, &[]).await;
    }

    /// Like [`Stack::restart_users`], with extra flags.
    pub async fn restart_users_with(&mut self, failpoints: Option<&str>, extra: &[&str]) {
        self.users_proxy.clear_backend();
        let _ = self.users.kill();
        self.users = start_service(
            &self.dbs,
            &self.log_filter,
            "users-svc",
            &self.users_proxy,
            failpoints,
            extra,
        )
        .await;
    }

    /// Waits for users-svc to die at an armed `abort` fail point.
    pub fn wait_for_users_abort(&mut self) {
        let status = self
            .users
            .wait_timeout(START_TIMEOUT)
            .expect("wait")
            .expect("users-svc aborts");
        self.users_proxy.clear_backend();
        assert_aborted("users-svc", status);
    }

    /// Starts student-svc again (on a fresh port, behind the same address), optionally
    /// with fail points armed.
    pub async fn restart_student(&mut self, failpoints: Option<&str>) {
        self.restart_student_with(failpoints, &[]).await;
    }

    /// Like [`Stack::restart_student`], with extra flags.
    pub async fn restart_student_with(&mut self, failpoints: Option<&str>, extra: &[&str]) {
        self.student_proxy.clear_backend();
        let _ = self.student.kill();
        self.student = start_service(
            &self.dbs,
            &self.log_filter,
            "student-svc",
            &self.student_proxy,
            failpoints,
            extra,
        )
        .await;
    }

    /// Waits for student-svc to die at an armed `abort` fail point.
    pub fn wait_for_student_abort(&mut self) {
        let status = self
            .student
            .wait_timeout(START_TIMEOUT)
            .expect("wait")
            .expect("student-svc aborts");
        self.student_proxy.clear_backend();
        assert_aborted("student-svc", status);
    }

    /// Runs a one-shot relay command (`replay …`, `status`, `retry-failed …`) to completion,
    /// in a clean environment.
    pub fn relay_command(&self, args: &[&str]) -> Output {
        self.relay_command_with(args, &[])
    }

    /// Like [`Stack::relay_command`], with extra environment variables.
    pub fn relay_command_with(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut command = std::process::Command::new(binaries().join("relay"));
        command
            .env_clear()
            .args(args)
            .env("STUDENT_DATABASE_URL", &self.dbs.student_url)
            .env("USERS_URL", format!("http://{}", self.users_addr))
            .env("RUST_LOG", &self.log_filter)
            .envs(envs.iter().copied());
        command.output().expect("run relay command")
    }

    /// Runs `relay audit` and asserts that it checked `students` students and found no
    /// problem: the two databases agree, as seen through Users' API.
    pub fn assert_audit_clean(&self, students: usize) {
        self.assert_audit_finds(students, &[]);
    }

    /// Runs `relay audit` and asserts that it checked `students` students and found exactly
    /// `problems`, in this order.
    pub fn assert_audit_finds(&self, students: usize, problems: &[String]) {
        let audit = self.relay_command(&["audit"]);
        let stdout = String::from_utf8_lossy(&audit.stdout);
        let mut expected: String = problems.iter().map(|line| format!("{line}\n")).collect();
        expected.push_str(&format!("checked={students} problems={}\n", problems.len()));
        assert_eq!(
            (audit.status.code(), stdout.as_ref()),
            (
                Some(u8::from(!problems.is_empty()).into()),
                expected.as_str()
            ),
            "relay audit: {}",
            String::from_utf8_lossy(&audit.stderr)
        );
    }

    /// Runs a one-shot `users-svc` command (`inbox show …`) on this stack's Users DB.
    pub fn users_command(&self, args: &[&str]) -> Output {
        self.users_command_with(args, &[])
    }

    /// Like [`Stack::users_command`], with extra environment variables.
    pub fn users_command_with(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        std::process::Command::new(binaries().join("users-svc"))
            .env_clear()
            .args(args)
            .env("USERS_DATABASE_URL", &self.dbs.users_url)
            .env("RUST_LOG", &self.log_filter)
            .envs(envs.iter().copied())
            .output()
            .expect("run users-svc command")
    }

    /// Creates students `range` through the student-svc process; returns their ids.
    pub async fn create_students(&self, range: std::ops::Range<usize>) -> Vec<String> {
        let mut client = self.student_client();
        let mut ids = Vec::new();
        for n in range {
            ids.push(
                client
                    .create_student(super::student_request(n))
                    .await
                    .expect("created")
                    .into_inner()
                    .id,
            );
        }
        ids
    }

    /// Changes student `id`'s first name through the student-svc process; returns the new
    /// version.
    pub async fn rename_student(&self, id: &str, first_name: &str) -> u64 {
        let mut client = self.student_client();
        let student = client
            .get_student(proto::student::v1::GetStudentRequest { id: id.to_owned() })
            .await
            .expect("found")
            .into_inner();
        client
            .update_student(proto::student::v1::UpdateStudentRequest {
                id: id.to_owned(),
                first_name: first_name.to_owned(),
                last_name: student.last_name,
                email: student.email,
                idempotency_key: None,
                expected_version: student.version,
            })
            .await
            .expect("updated")
            .into_inner()
            .version
    }

    /// Deactivates student `id` through the student-svc process; returns the new version.
    pub async fn deactivate_student(&self, id: &str) -> u64 {
        self.student_client()
            .deactivate_student(proto::student::v1::DeactivateStudentRequest {
                id: id.to_owned(),
                idempotency_key: None,
            })
            .await
            .expect("deactivated")
            .into_inner()
            .version
    }

    /// Students whose every change Users has applied (`synced_version = version`).
    pub async fn synced_students(&self) -> u64 {
        students::Entity::find()
            .filter(sea_orm::sea_query::ExprTrait::eq(
                sea_orm::sea_query::Expr::col(students::Column::SyncedVersion),
                sea_orm::sea_query::Expr::col(students::Column::Version),
            ))
            .count(&self.student_db)
            .await
            .expect("count synced")
    }

    /// Waits until `expected` students are synced, failing at once if a process died.
    pub async fn wait_until_all_synced(&mut self, expected: u64) {
        let deadline = tokio::time::Instant::now() + LINK_DEADLINE;
        while self.synced_students().await != expected {
            self.assert_running();
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {LINK_DEADLINE:?} waiting for {expected} students synced"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Students whose user is linked.
    pub async fn linked_students(&self) -> u64 {
        students::Entity::find()
            .filter(students::Column::UserId.is_not_null())
            .count(&self.student_db)
            .await
            .expect("count linked")
    }

    /// Waits until `expected` students are linked, failing at once if a process died.
    pub async fn wait_until_all_linked(&mut self, expected: u64) {
        let deadline = tokio::time::Instant::now() + LINK_DEADLINE;
        while self.linked_students().await != expected {
            self.assert_running();
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {LINK_DEADLINE:?} waiting for {expected} students linked"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The outbox, oldest row first.
    pub async fn outbox_rows(&self) -> Vec<outbox::Model> {
        outbox::Entity::find()
            .order_by_asc(outbox::Column::Id)
            .all(&self.student_db)
            .await
            .expect("outbox")
    }

    /// Every log the processes wrote so far (every file).
    pub fn all_logs(&self) -> String {
        let mut names = vec!["users-svc.log".to_owned(), "student-svc.log".to_owned()];
        names.extend((0..self.relays_started).map(|n| format!("relay-{n}.log")));
        names
            .iter()
            .map(|name| std::fs::read_to_string(self.dbs.dir.path().join(name)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What every relay logged so far, relay by relay.
    pub fn relay_log(&self) -> String {
        (0..self.relays_started)
            .map(|n| self.log_of(&format!("relay-{n}")))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What relay number `n` (in start order, from 0) logged so far.
    pub fn relay_log_of(&self, n: usize) -> String {
        self.log_of(&format!("relay-{n}"))
    }

    /// What `name` (`users-svc`, `student-svc`, `relay-N`) logged so far.
    pub fn log_of(&self, name: &str) -> String {
        log_of(&self.dbs, name)
    }

    /// Waits until the log of `name` holds `count` lines containing `needle` (log lines
    /// reach the file a moment after what they describe reached the database).
    pub async fn wait_for_log_lines(&self, name: &str, needle: &str, count: usize) -> String {
        wait_for_log_lines(&self.dbs, name, needle, count).await
    }

    /// Where `name` (`users-svc`, `student-svc`, `relay-N`) serves its metrics: the address
    /// it logged last (a restarted process appends to the same log).
    pub async fn metrics_addr(&self, name: &str) -> SocketAddr {
        let log = self.wait_for_log_lines(name, "metrics_addr=", 1).await;
        let line = log
            .lines()
            .rev()
            .find(|line| line.contains("metrics_addr="))
            .expect("a metrics line");
        let rest = &line[line.find("metrics_addr=").expect("found") + "metrics_addr=".len()..];
        rest.split_whitespace()
            .next()
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    }

    /// Waits until the relays' logs together hold `count` lines containing `needle`.
    pub async fn wait_for_relay_log_lines(&self, needle: &str, count: usize) -> String {
        super::eventually(
            &format!("{count} relay log lines with {needle:?}"),
            LINK_DEADLINE,
            || async {
                let log = self.relay_log();
                (log.lines().filter(|line| line.contains(needle)).count() >= count).then_some(log)
            },
        )
        .await
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Show what the processes logged: the test harness prints it with the failure.
            let relays = (0..self.relays_started).map(|n| format!("relay-{n}"));
            for name in ["users-svc".to_owned(), "student-svc".to_owned()]
                .into_iter()
                .chain(relays)
            {
                let log = self.dbs.dir.path().join(format!("{name}.log"));
                if let Ok(text) = std::fs::read_to_string(&log) {
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    eprintln!("--- last lines of {name}.log ---");
                    for line in tail.into_iter().rev() {
                        eprintln!("{line}");
                    }
                }
            }
        }
    }
}

fn assert_aborted(name: &str, status: ExitStatus) {
    assert_eq!(
        status.signal(),
        Some(Signal::SIGABRT as i32),
        "{name} should die at its fail point, ended {status}"
    );
}

/// Starts `users-svc` or `student-svc` on a fresh port, waits until it is healthy, and
/// points `proxy` at it.
async fn start_service(
    dbs: &TestDatabases,
    log_filter: &str,
    name: &str,
    proxy: &Proxy,
    failpoints: Option<&str>,
    extra: &[&str],
) -> Process {
    let url = if name == "users-svc" {
        &dbs.users_url
    } else {
        &dbs.student_url
    };
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--database-url", url]
        .map(str::to_owned)
        .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let mut process = spawn(dbs, log_filter, name, name, &args, failpoints);
    let addr = process
        .listening_addr(START_TIMEOUT)
        .unwrap_or_else(|err| panic!("{name} listens: {err:#}"));
    let service = if name == "users-svc" {
        "users.v1.UsersService"
    } else {
        "student.v1.StudentService"
    };
    wait_until_serving(addr, service, START_TIMEOUT)
        .await
        .unwrap_or_else(|err| panic!("{name} healthy: {err:#}"));
    proxy.set_backend(addr, process.pid());
    process
}

/// What `name` logged so far in `dbs`' directory.
fn log_of(dbs: &TestDatabases, name: &str) -> String {
    std::fs::read_to_string(dbs.dir.path().join(format!("{name}.log"))).unwrap_or_default()
}

/// Runs `command` (a binary expected to refuse its settings and exit) and returns its output; a
/// server that starts instead fails the test after 30 s rather than hanging it.
pub async fn exits_within_30_s(
    command: &mut tokio::process::Command,
    what: &str,
) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the binary");
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after 30 s"))
        .expect("its output")
}

/// See [`Stack::wait_for_log_lines`].
pub async fn wait_for_log_lines(
    dbs: &TestDatabases,
    name: &str,
    needle: &str,
    count: usize,
) -> String {
    super::eventually(
        &format!("{count} lines with {needle:?} in {name}.log"),
        LINK_DEADLINE,
        || async {
            let log = log_of(dbs, name);
            (log.lines().filter(|line| line.contains(needle)).count() >= count).then_some(log)
        },
    )
    .await
}

fn spawn_relay(
    dbs: &TestDatabases,
    database_url: &str,
    log_filter: &str,
    number: usize,
    users_addr: SocketAddr,
    failpoints: Option<&str>,
    extra: &[&str],
) -> Process {
    let users_url = format!("http://{users_addr}");
    let mut args: Vec<String> = [
        "--database-url",
        database_url,
        "--users-url",
        &users_url,
        "run",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(RELAY_TUNING.iter().chain(extra).map(|a| (*a).to_owned()));
    let log_name = format!("relay-{number}");
    spawn(dbs, log_filter, "relay", &log_name, &args, failpoints)
}

/// Starts `binary` in a clean environment (nothing the developer exported leaks in),
/// logging to `<log_name>.log` in the test's directory.
fn spawn(
    dbs: &TestDatabases,
    log_filter: &str,
    binary: &str,
    log_name: &str,
    args: &[String],
    failpoints: Option<&str>,
) -> Process {
    let mut envs = vec![("RUST_LOG".to_owned(), log_filter.to_owned())];
    if let Some(failpoints) = failpoints {
        envs.push(("FAILPOINTS".to_owned(), failpoints.to_owned()));
    }
    Process::spawn_isolated(
        &binaries().join(binary),
        args,
        &envs,
        &dbs.dir.path().join(format!("{log_name}.log")),
    )
    .unwrap_or_else(|err| panic!("start {binary}: {err:#}"))
}
