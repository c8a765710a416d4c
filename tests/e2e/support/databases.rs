//! A fresh pair of databases per test: two SQLite files in a temporary directory, or two
//! new PostgreSQL databases created through `TEST_POSTGRES_URL` (a maintenance database
//! URL) and dropped afterwards.

use sea_orm::{ConnectionTrait, Database};
use tempfile::TempDir;
use uuid::Uuid;

/// The storage engine a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The Student DB and Users DB of one test, and a directory for its files and logs.
pub struct TestDatabases {
    pub dir: TempDir,
    pub student_url: String,
    pub users_url: String,
    postgres: Option<DropDatabases>,
}

impl TestDatabases {
    /// Creates empty databases, or returns `None` (the test is skipped) for PostgreSQL when
    /// `TEST_POSTGRES_URL` is not set. With `TEST_POSTGRES_REQUIRED=1` (CI) a missing URL
    /// fails the test instead, so PostgreSQL can never be skipped silently.
    pub async fn create(backend: Backend) -> Option<Self> {
        let dir = tempfile::Builder::new()
            .prefix("outbox-test-")
            .tempdir()
            .expect("temporary directory");
        match backend {
            Backend::Sqlite => {
                let url =
                    |name: &str| format!("sqlite://{}/{name}.db?mode=rwc", dir.path().display());
                Some(Self {
                    student_url: url("student"),
                    users_url: url("users"),
                    dir,
                    postgres: None,
                })
            }
            Backend::Postgres => {
                let Ok(admin_url) = std::env::var("TEST_POSTGRES_URL") else {
                    assert!(
                        std::env::var("TEST_POSTGRES_REQUIRED").as_deref() != Ok("1"),
                        "TEST_POSTGRES_REQUIRED=1 but TEST_POSTGRES_URL is not set"
                    );
                    announce_postgres_skipped();
                    return None;
                };
                let suffix = Uuid::new_v4().simple().to_string();
                let names = [format!("student_{suffix}"), format!("users_{suffix}")];
                let admin = Database::connect(&admin_url)
                    .await
                    .expect("connect to TEST_POSTGRES_URL");
                for name in &names {
                    admin
                        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
                        .await
                        .expect("create test database");
                }
                admin.close().await.ok();
                Some(Self {
                    student_url: with_database(&admin_url, &names[0]),
                    users_url: with_database(&admin_url, &names[1]),
                    dir,
                    postgres: Some(DropDatabases {
                        admin_url,
                        names: names.to_vec(),
                    }),
                })
            }
        }
    }
}

impl TestDatabases {
    /// Refuses every connection to the Student database and ends the open ones, or lets
    /// connections in again (PostgreSQL only): the database going away and coming back
    /// with its data intact.
    pub async fn set_student_database_reachable(&self, reachable: bool) {
        let cleanup = self.postgres.as_ref().expect("a PostgreSQL test");
        let name = &cleanup.names[0];
        let admin = Database::connect(&cleanup.admin_url)
            .await
            .expect("connect admin");
        admin
            .execute_unprepared(&format!(
                "ALTER DATABASE \"{name}\" WITH ALLOW_CONNECTIONS {reachable}"
            ))
            .await
            .expect("allow or refuse connections");
        if !reachable {
            admin
                .execute_unprepared(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                ))
                .await
                .expect("end the open connections");
        }
        admin.close().await.ok();
    }

    /// Drops the Users database now, closing every connection to it (PostgreSQL only):
    /// the way to make a database unreachable under a running service.
    pub async fn drop_users_database_now(&self) {
        let cleanup = self.postgres.as_ref().expect("a PostgreSQL test");
        let admin = Database::connect(&cleanup.admin_url)
            .await
            .expect("connect admin");
        admin
            .execute_unprepared(&format!(
                "DROP DATABASE \"{}\" WITH (FORCE)",
                cleanup.names[1]
            ))
            .await
            .expect("drop the Users database");
        admin.close().await.ok();
    }
}

impl Drop for TestDatabases {
    fn drop(&mut self) {
        if let Some(cleanup) = self.postgres.take() {
            cleanup.run();
        }
    }
}

/// Drops a test's PostgreSQL databases, even from inside an async test.
struct DropDatabases {
    admin_url: String,
    names: Vec<String>,
}

impl DropDatabases {
    fn run(self) {
        // A runtime of its own on a thread of its own: Drop cannot await, and the test's
        // runtime may be shutting down.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(admin) = Database::connect(&self.admin_url).await {
                    for name in &self.names {
                        let _ = admin
                            .execute_unprepared(&format!(
                                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                            ))
                            .await;
                    }
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}

/// Says once per test run, on the real stderr, that the PostgreSQL variants did not run.
/// (libtest hides what a passing test prints, so a notice per test would never be seen.)
fn announce_postgres_skipped() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(
            b"\nnote: TEST_POSTGRES_URL is not set: every ::postgres test returns at once \
              and counts as passed without running\n",
        );
    });
}

/// Replaces the database name in a PostgreSQL URL, keeping any query string.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

#[test]
fn with_database_swaps_only_the_name() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
        "postgres://postgres@127.0.0.1:5432/t1"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "t2"),
        "postgres://u:p@h/t2?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h", "t3"), "postgres://h/t3");
}
