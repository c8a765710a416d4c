//! CreateStudent's group commit: students asked for while one transaction commits are
//! written together in the next, many to one transaction (see
//! [`student_store::students::create_each`]), instead of one transaction each.
//!
//! A request is answered only once the transaction holding its student has committed, so
//! each caller's guarantee is the one a transaction of its own gives: its student and the
//! intention to create its login user are on disk together, or neither is. What changes is
//! the cost: one commit (a disk sync) and one statement for a whole group. A lone request,
//! arriving when a writer is free, is written at once and waits for nobody.

use platform::group_commit::GroupCommit;
use sea_orm::{DatabaseConnection, DbBackend, DbErr};
use student_store::{
    students::{self as store, CommitPath, NewStudentRow, StudentView},
    wake::RelayBell,
};

/// Transactions committing at once on PostgreSQL. Two: while one waits for its WAL flush,
/// the other takes the requests that arrived meanwhile.
const POSTGRES_WRITERS: usize = 2;

/// On SQLite one: it has one write lock, and a second writer would only wait for it (in
/// the busy handler's sleeps).
const SQLITE_WRITERS: usize = 1;

/// Most students in one transaction: a group of requests that arrived together (at most
/// the requests in flight), well within a statement's bind limit.
const MAX_GROUP: usize = 64;

/// Counts committed transactions by path (`alone`, `together`, `each`).
pub const COMMITS: &str = "student_create_commits_total";
/// Counts the students those transactions wrote, by path.
pub const COMMITTED: &str = "student_create_committed_total";

/// A handle to CreateStudent's writers; cheap to clone.
#[derive(Clone)]
pub struct StudentWriter {
    writers: GroupCommit<NewStudentRow, Result<StudentView, DbErr>>,
}

impl StudentWriter {
    /// Starts the writers (inside a Tokio runtime); they stop with the last handle.
    pub fn start(db: DatabaseConnection, bell: RelayBell) -> Self {
        let count = match db.get_database_backend() {
            DbBackend::Postgres => POSTGRES_WRITERS,
            _ => SQLITE_WRITERS,
        };
        let writers = GroupCommit::start(count, MAX_GROUP, move |news| {
            let (db, bell) = (db.clone(), bell.clone());
            async move {
                let (path, outcomes) = store::create_each(&db, &bell, news).await;
                count_commits(path, &outcomes);
                outcomes
            }
        });
        Self { writers }
    }

    /// Writes `new` with the students asked for around the same time; returns once its
    /// transaction has committed, with the answer it would have had alone.
    pub async fn create(&self, new: NewStudentRow) -> Result<StudentView, DbErr> {
        self.writers.submit(new).await.unwrap_or_else(|| {
            Err(DbErr::Custom(
                "CreateStudent's write got no answer: its writer stopped or failed".into(),
            ))
        })
    }
}

/// Counts what a group really wrote: only students whose transaction committed (a
/// student refused for a taken document number, or a group that failed, wrote nothing),
/// in one transaction for `alone` and `together`, one each for `each`.
fn count_commits(path: CommitPath, outcomes: &[Result<StudentView, DbErr>]) {
    let written = outcomes.iter().filter(|outcome| outcome.is_ok()).count() as u64;
    let transactions = match path {
        CommitPath::Alone | CommitPath::Together => written.min(1),
        CommitPath::Each => written,
    };
    metrics::counter!(COMMITS, "path" => path.label()).increment(transactions);
    metrics::counter!(COMMITTED, "path" => path.label()).increment(written);
}

/// Gives the writer's metrics their help text; call once after the recorder is installed.
pub fn describe() {
    metrics::describe_counter!(
        COMMITS,
        "CreateStudent transactions committed, by path: alone (one student), together (several in one), each (several, one by one after the shared one was refused)"
    );
    metrics::describe_counter!(COMMITTED, "Students written by those transactions, by path");
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;
    use platform::db::now;
    use uuid::Uuid;

    use super::*;

    fn new_student(n: usize, document_number: &str) -> NewStudentRow {
        NewStudentRow {
            id: Uuid::now_v7(),
            first_name: format!("First{n}"),
            last_name: "Last".into(),
            email: format!("student{n}@example.com"),
            document_number: document_number.into(),
            client_key: None,
            request_hash: format!("hash-{n}"),
            created_at: now(),
            traceparent: String::new(),
        }
    }

    /// Writes `news` as one group; returns the path it took and what the counters say
    /// of it (a recorder of its own, as Prometheus text).
    async fn counted(db: &DatabaseConnection, news: Vec<NewStudentRow>) -> (CommitPath, String) {
        let (path, outcomes) = store::create_each(db, &RelayBell::silent(), news).await;
        let recorder = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || count_commits(path, &outcomes));
        (path, recorder.handle().render())
    }

    /// Asserts what the counters of `path` say: `commits` transactions, `committed` students.
    fn assert_counted(text: &str, path: &str, commits: u64, committed: u64) {
        for (counter, value) in [("commits", commits), ("committed", committed)] {
            let line = format!("student_create_{counter}_total{{path=\"{path}\"}} {value}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    /// The counters say how many transactions committed, not how many groups: a group
    /// written together is one, a group written one by one (after two of its students
    /// turned out to share a document number) is one per student written, a student
    /// alone is one, and a refused student is in no count.
    #[tokio::test]
    async fn commits_are_counted_per_transaction_on_each_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("student.db").display()
        );
        let db = crate::open_database(&url, 4).await.expect("open");

        let (path, text) = counted(&db, vec![new_student(1, "D1"), new_student(2, "D2")]).await;
        assert_eq!(path, CommitPath::Together);
        assert_counted(&text, "together", 1, 2);

        let group = vec![
            new_student(3, "D3"),
            new_student(4, "D3"),
            new_student(5, "D5"),
        ];
        let (path, text) = counted(&db, group).await;
        assert_eq!(path, CommitPath::Each);
        assert_counted(&text, "each", 2, 2);

        // A student alone is one transaction.
        let (path, text) = counted(&db, vec![new_student(6, "D6")]).await;
        assert_eq!(path, CommitPath::Alone);
        assert_counted(&text, "alone", 1, 1);
        // Refused alone (D6 is taken now), none.
        let (path, text) = counted(&db, vec![new_student(7, "D6")]).await;
        assert_eq!(path, CommitPath::Alone);
        assert_counted(&text, "alone", 0, 0);
    }
}
