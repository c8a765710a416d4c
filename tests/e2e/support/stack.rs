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
use proto::student::v1::student_service_client::StudentServiceClient;
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
};
use student_svc::entity::{outbox, students};
use tonic::transport::Channel;

use super::{Backend, TestDatabases};

const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a backlog of a few hundred students may take to drain on a loaded CI machine.
pub const LINK_DEADLINE: Duration = Duration::from_secs(90);

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
pub struct Stack {
    /// `RUST_LOG` of every process this stack starts.
    pub log_filter: String,
    pub users: Process,
    pub student: Process,
    pub relays: Vec<Process>,
    pub users_addr: SocketAddr,
    pub student_addr: SocketAddr,
    pub student_db: DatabaseConnection,
    pub users_db: DatabaseConnection,
    // Dropped last, after every process and connection.
    pub dbs: TestDatabases,
}

impl Stack {
    /// Starts Users, then one relay (before the Student DB has a schema: it must wait),
    /// then Student; returns once both services are healthy.
    pub async fn start(backend: Backend) -> Option<Self> {
        Self::start_logging(backend, "info").await
    }

    /// Like [`Stack::start`], with `RUST_LOG=log_filter` for every process.
    pub async fn start_logging(backend: Backend, log_filter: &str) -> Option<Self> {
        let dbs = TestDatabases::create(backend).await?;
        let mut users = spawn(
            &dbs,
            log_filter,
            "users-svc",
            &users_args(&dbs, "127.0.0.1:0"),
            None,
        );
        let users_addr = users
            .listening_addr(START_TIMEOUT)
            .expect("users-svc listens");
        let relay = spawn_relay(&dbs, log_filter, users_addr, None, &[]);
        let mut student = spawn(
            &dbs,
            log_filter,
            "student-svc",
            &student_args(&dbs, "127.0.0.1:0"),
            None,
        );
        let student_addr = student
            .listening_addr(START_TIMEOUT)
            .expect("student-svc listens");
        wait_until_serving(users_addr, "users.v1.UsersService", START_TIMEOUT)
            .await
            .expect("users-svc healthy");
        wait_until_serving(student_addr, "student.v1.StudentService", START_TIMEOUT)
            .await
            .expect("student-svc healthy");
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
            users_addr,
            student_addr,
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
    /// still running after `timeout`).
    pub fn terminate_all(&mut self, timeout: Duration) -> Vec<(String, Option<ExitStatus>)> {
        let processes = self
            .relays
            .iter_mut()
            .chain([&mut self.student, &mut self.users]);
        processes
            .map(|process| {
                process.signal(Signal::SIGTERM).expect("SIGTERM");
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

    /// Starts one more relay, with `failpoints` armed (`FAILPOINTS` syntax) if given, and
    /// extra `run` flags (later flags override the test tuning).
    pub fn start_relay(&mut self, failpoints: Option<&str>, extra: &[&str]) {
        self.relays.push(spawn_relay(
            &self.dbs,
            &self.log_filter,
            self.users_addr,
            failpoints,
            extra,
        ));
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

    /// Kills users-svc with SIGKILL.
    pub fn kill_users(&mut self) {
        self.users.kill().expect("kill users-svc");
    }

    /// Starts users-svc again on its address, optionally with fail points armed.
    pub async fn restart_users(&mut self, failpoints: Option<&str>) {
        self.restart_users_with(failpoints, &[]).await;
    }

    /// Like [`Stack::restart_users`], with extra flags.
    pub async fn restart_users_with(&mut self, failpoints: Option<&str>, extra: &[&str]) {
        let _ = self.users.kill();
        let mut args = users_args(&self.dbs, &self.users_addr.to_string());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        self.users = spawn(&self.dbs, &self.log_filter, "users-svc", &args, failpoints);
        self.users
            .listening_addr(START_TIMEOUT)
            .expect("users-svc listens again");
        wait_until_serving(self.users_addr, "users.v1.UsersService", START_TIMEOUT)
            .await
            .expect("users-svc healthy");
    }

    /// Waits for users-svc to die at an armed `abort` fail point.
    pub fn wait_for_users_abort(&mut self) {
        let status = self
            .users
            .wait_timeout(START_TIMEOUT)
            .expect("wait")
            .expect("users-svc aborts");
        assert_aborted("users-svc", status);
    }

    /// Starts student-svc again on its address, optionally with fail points armed.
    pub async fn restart_student(&mut self, failpoints: Option<&str>) {
        let _ = self.student.kill();
        let args = student_args(&self.dbs, &self.student_addr.to_string());
        self.student = spawn(
            &self.dbs,
            &self.log_filter,
            "student-svc",
            &args,
            failpoints,
        );
        self.student
            .listening_addr(START_TIMEOUT)
            .expect("student-svc listens again");
        wait_until_serving(
            self.student_addr,
            "student.v1.StudentService",
            START_TIMEOUT,
        )
        .await
        .expect("student-svc healthy");
    }

    /// Waits for student-svc to die at an armed `abort` fail point.
    pub fn wait_for_student_abort(&mut self) {
        let status = self
            .student
            .wait_timeout(START_TIMEOUT)
            .expect("wait")
            .expect("student-svc aborts");
        assert_aborted("student-svc", status);
    }

    /// Runs a one-shot relay command (`replay …`, `status`, `retry-failed …`) to completion.
    pub fn relay_command(&self, args: &[&str]) -> Output {
        let mut command = std::process::Command::new(binaries().join("relay"));
        command
            .args(args)
            .env("STUDENT_DATABASE_URL", &self.dbs.student_url)
            .env("USERS_URL", format!("http://{}", self.users_addr))
            .env("RUST_LOG", &self.log_filter);
        command.output().expect("run relay command")
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

    /// Every log the processes wrote so far (all three files).
    pub fn all_logs(&self) -> String {
        ["users-svc", "student-svc", "relay"]
            .iter()
            .map(|name| {
                std::fs::read_to_string(self.dbs.dir.path().join(format!("{name}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The relays' log so far.
    pub fn relay_log(&self) -> String {
        std::fs::read_to_string(self.dbs.dir.path().join("relay.log")).unwrap_or_default()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Show what the processes logged: the test harness prints it with the failure.
            for name in ["users-svc", "student-svc", "relay"] {
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

fn users_args(dbs: &TestDatabases, listen: &str) -> Vec<String> {
    ["--listen", listen, "--database-url", &dbs.users_url]
        .map(str::to_owned)
        .to_vec()
}

fn student_args(dbs: &TestDatabases, listen: &str) -> Vec<String> {
    ["--listen", listen, "--database-url", &dbs.student_url]
        .map(str::to_owned)
        .to_vec()
}

fn spawn_relay(
    dbs: &TestDatabases,
    log_filter: &str,
    users_addr: SocketAddr,
    failpoints: Option<&str>,
    extra: &[&str],
) -> Process {
    let users_url = format!("http://{users_addr}");
    let mut args: Vec<String> = [
        "--database-url",
        &dbs.student_url,
        "--users-url",
        &users_url,
        "run",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(RELAY_TUNING.iter().chain(extra).map(|a| (*a).to_owned()));
    spawn(dbs, log_filter, "relay", &args, failpoints)
}

fn spawn(
    dbs: &TestDatabases,
    log_filter: &str,
    name: &str,
    args: &[String],
    failpoints: Option<&str>,
) -> Process {
    let mut envs = vec![("RUST_LOG".to_owned(), log_filter.to_owned())];
    if let Some(failpoints) = failpoints {
        envs.push(("FAILPOINTS".to_owned(), failpoints.to_owned()));
    }
    Process::spawn(
        &binaries().join(name),
        args,
        &envs,
        &dbs.dir.path().join(format!("{name}.log")),
    )
    .unwrap_or_else(|err| panic!("start {name}: {err:#}"))
}
