//! The three real binaries as processes on this test's databases and ports, to be killed
//! and restarted like in production.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Output,
    sync::OnceLock,
    time::Duration,
};

use devstack::{Process, wait_until_serving};
use proto::student::v1::student_service_client::StudentServiceClient;
use sea_orm::DatabaseConnection;
use tonic::transport::Channel;

use super::{Backend, TestDatabases};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the binaries once per test run and returns their directory.
pub fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        devstack::build_binaries(!cfg!(debug_assertions)).expect("build the binaries")
    })
}

/// `users-svc`, `student-svc` and `relay` running against one test's databases.
pub struct Stack {
    pub users: Process,
    pub student: Option<Process>,
    pub relay: Option<Process>,
    pub users_addr: SocketAddr,
    pub student_addr: SocketAddr,
    pub student_db: DatabaseConnection,
    pub users_db: DatabaseConnection,
    // Dropped last, after every process and connection.
    pub dbs: TestDatabases,
}

impl Stack {
    /// Starts Users, then the relay (before the Student DB has a schema: it must wait), then
    /// Student; returns once both services are healthy.
    pub async fn start(backend: Backend) -> Option<Self> {
        let dbs = TestDatabases::create(backend).await?;
        let bin = binaries();
        let mut users = spawn(
            bin,
            &dbs,
            "users-svc",
            &["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url],
        );
        let users_addr = users
            .listening_addr(START_TIMEOUT)
            .expect("users-svc listens");
        let relay = spawn_relay(&dbs, users_addr);
        let mut student = spawn(
            bin,
            &dbs,
            "student-svc",
            &[
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &dbs.student_url,
            ],
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
            users,
            student: Some(student),
            relay: Some(relay),
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
        let processes = [
            Some(&mut self.users),
            self.student.as_mut(),
            self.relay.as_mut(),
        ];
        for process in processes.into_iter().flatten() {
            if let Ok(Some(status)) = process.try_wait() {
                panic!("{} exited with {status}", process.name());
            }
        }
    }

    /// Sends SIGTERM to every running process, relay first, and returns how each ended
    /// (`None`: still running after `timeout`).
    pub fn terminate_all(
        &mut self,
        timeout: Duration,
    ) -> Vec<(String, Option<std::process::ExitStatus>)> {
        let processes = [
            self.relay.as_mut(),
            self.student.as_mut(),
            Some(&mut self.users),
        ];
        processes
            .into_iter()
            .flatten()
            .map(|process| {
                process
                    .signal(nix::sys::signal::Signal::SIGTERM)
                    .expect("SIGTERM");
                let status = process.wait_timeout(timeout).expect("wait");
                (process.name().to_owned(), status)
            })
            .collect()
    }

    /// Kills the relay with SIGKILL, as a crash would.
    pub fn kill_relay(&mut self) {
        if let Some(mut relay) = self.relay.take() {
            relay.kill().expect("kill relay");
        }
    }

    /// Starts a (new) relay process.
    pub fn start_relay(&mut self) {
        assert!(self.relay.is_none(), "a relay is already running");
        self.relay = Some(spawn_relay(&self.dbs, self.users_addr));
    }

    /// Kills users-svc with SIGKILL.
    pub fn kill_users(&mut self) {
        self.users.kill().expect("kill users-svc");
    }

    /// Restarts users-svc on the address it had, so the relay finds it again.
    pub async fn restart_users(&mut self) {
        let listen = self.users_addr.to_string();
        self.users = spawn(
            binaries(),
            &self.dbs,
            "users-svc",
            &["--listen", &listen, "--database-url", &self.dbs.users_url],
        );
        self.users
            .listening_addr(START_TIMEOUT)
            .expect("users-svc listens again");
        wait_until_serving(self.users_addr, "users.v1.UsersService", START_TIMEOUT)
            .await
            .expect("users-svc healthy");
    }

    /// Runs a one-shot relay command (`replay …`, `status`) to completion.
    pub fn relay_command(&self, args: &[&str]) -> Output {
        let mut command = std::process::Command::new(binaries().join("relay"));
        command
            .args(args)
            .env("STUDENT_DATABASE_URL", &self.dbs.student_url)
            .env("USERS_URL", format!("http://{}", self.users_addr))
            .env("RUST_LOG", "warn");
        command.output().expect("run relay command")
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

fn spawn_relay(dbs: &TestDatabases, users_addr: SocketAddr) -> Process {
    let users_url = format!("http://{users_addr}");
    spawn(
        binaries(),
        dbs,
        "relay",
        &[
            "--database-url",
            &dbs.student_url,
            "--users-url",
            &users_url,
            "run",
            "--poll-interval",
            "50ms",
            "--backoff-base",
            "50ms",
            "--backoff-max",
            "500ms",
            "--call-timeout",
            "2s",
        ],
    )
}

fn spawn(bin: &Path, dbs: &TestDatabases, name: &str, args: &[&str]) -> Process {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let envs = vec![("RUST_LOG".to_owned(), "info".to_owned())];
    Process::spawn(
        &bin.join(name),
        &args,
        &envs,
        &dbs.dir.path().join(format!("{name}.log")),
    )
    .unwrap_or_else(|err| panic!("start {name}: {err:#}"))
}
