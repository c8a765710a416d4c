//! The three real binaries as processes: started in an awkward order, killed with SIGKILL,
//! restarted; every student still ends linked exactly once.

use std::time::Duration;

use devstack::{Process, wait_until_serving};
use nix::sys::signal::Signal;
use platform::failpoint::points;
use proto::student::v1::{GetStudentRequest, UserLinkStatus};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use student_store::entity::outbox::{self, OutboxStatus};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    on_both_backends,
    support::{
        Backend, TestDatabases, conflicting_user_request, eventually,
        invariants::{
            assert_each_student_linked_exactly_once, assert_linked_at_first_attempt,
            students_and_outbox_rows, users_and_inbox_rows,
        },
        metrics::{gauge, sample, scrape},
        stack::{
            CALLS_OUTLAST_A_STALL, LINK_DEADLINE, RELAY_WAITS_FOR_THE_SCHEMA, Stack, binaries,
            exits_within_30_s, wait_for_log_lines,
        },
    },
};

on_both_backends!(
    three_binaries_link_every_student_and_replay_creates_nothing,
    no_transaction_is_held_open_across_the_call_to_users,
    a_relay_killed_mid_delivery_and_restarted_loses_and_duplicates_nothing,
    users_svc_killed_and_restarted_delays_but_loses_nothing,
    sigterm_and_ctrl_c_stop_every_binary_cleanly,
    sigterm_lets_a_relay_finish_the_calls_it_has_in_flight,
    sigterm_during_a_claim_hands_its_rows_back_unsent,
    one_shot_commands_on_a_database_with_no_schema_say_which_service_to_start,
    a_relay_waiting_for_the_student_db_stops_when_told,
    a_relay_tuned_against_its_own_rules_refuses_to_start,
    inbox_purge_deletes_keys_past_the_retention_now_and_keeps_the_users,
    a_request_past_the_server_timeout_is_cancelled_and_stores_nothing,
    every_users_write_passes_the_on_request_fail_point,
    two_replicas_migrating_one_empty_database_at_once_both_serve,
    direct_mode_loses_the_student_where_the_outbox_does_not,
    calls_users_sheds_cost_no_attempt_and_the_relay_sends_fewer,
    student_svc_sheds_what_exceeds_its_max_concurrent_requests,
    a_shed_row_the_lease_cannot_wait_for_goes_back_with_its_attempt,
    every_binary_runs_on_one_thread,
    rust_log_defaults_to_info_and_warn_with_listening_keeps_only_the_addr_line,
    a_log_reader_that_stops_reading_stops_no_service,
    waiting_create_user_rows_go_to_users_many_to_a_call,
    a_relay_whose_wake_ups_fail_gets_them_back_and_claims_what_it_missed,
);

async fn three_binaries_link_every_student_and_replay_creates_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..20).await;
    stack.wait_until_all_linked(20).await;
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 20).await;
    let mut client = stack.student_client();
    for id in &ids {
        let student = client
            .get_student(GetStudentRequest { id: id.clone() })
            .await
            .expect("found")
            .into_inner();
        assert_eq!(student.user_link_status(), UserLinkStatus::Linked);
        assert_eq!(
            student.user_id,
            links[&id.parse().expect("uuid")].to_string()
        );
    }

    let replay = stack.relay_command(&["replay", "--all"]);
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "replay output:\n{stdout}\n{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 21);
    for (line, row) in lines.iter().zip(stack.outbox_rows().await) {
        let expected = format!(
            "key={} effect=create-user student={} user={} from_inbox=true matches_link=true",
            row.idempotency_key, row.aggregate_id, links[&row.aggregate_id]
        );
        assert_eq!(*line, expected);
    }
    assert_eq!(lines[20], "replayed=20 matched=20 mismatched=0 errors=0");
    // No ring after twenty commits failed, and on SQLite (no NOTIFY) none was tried.
    // (That a ring wakes a relay: relay_claims' wake-up tests.)
    let student_log = stack.log_of("student-svc");
    assert!(!student_log.contains("cannot NOTIFY"), "{student_log}");
    // One row by its key; a key no delivered row has is an error, not a verdict.
    let first = lines[0].to_owned();
    let key = first
        .split_whitespace()
        .find_map(|field| field.strip_prefix("key="))
        .expect("a key");
    let one = stack.relay_command(&["replay", "--key", key]);
    assert_eq!(one.status.code(), Some(0), "{one:?}");
    assert_eq!(
        String::from_utf8_lossy(&one.stdout),
        format!("{first}\nreplayed=1 matched=1 mismatched=0 errors=0\n")
    );
    let unknown = stack.relay_command(&["replay", "--key", "no-such-key"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert_eq!(
        String::from_utf8_lossy(&unknown.stdout),
        "no delivered outbox row matches --key no-such-key\n\
         replayed=0 matched=0 mismatched=0 errors=1\n"
    );
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (20, 20),
        "replay created nothing"
    );

    let status = stack.relay_command(&["status"]);
    assert_eq!(status.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "pending 0\nprocessing 0\ndone 20\nfailed 0\noldest_pending_age_seconds 0\nretrying 0\nblocked 0\n"
    );
    // `status`, `show` (below) and `purge` need the Student DB alone: a Users CA file that
    // cannot be read does not stop them; a command that calls Users names it.
    let no_ca = [("USERS_TLS_CA", "/nonexistent/users-ca.pem")];
    let without_ca = stack.relay_command_with(&["status"], &no_ca);
    assert_eq!(
        (without_ca.status.code(), &without_ca.stdout),
        (Some(0), &status.stdout)
    );
    let purge = stack.relay_command_with(&["purge"], &no_ca);
    assert_eq!(
        (purge.status.code(), String::from_utf8_lossy(&purge.stdout)),
        (Some(0), "purged=0\n".into())
    );
    let needs_ca = stack.relay_command_with(&["replay", "--all"], &no_ca);
    assert_eq!(needs_ca.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&needs_ca.stderr).contains("cannot read /nonexistent/users-ca.pem"),
        "{needs_ca:?}"
    );

    // `relay show`: one student's rows as stored, its payload (personal data) left out.
    let row = stack.outbox_rows().await.remove(0);
    let student = row.aggregate_id.to_string();
    let show = stack.relay_command_with(&["show", "--student", &student], &no_ca);
    let shown = String::from_utf8_lossy(&show.stdout);
    assert_eq!(show.status.code(), Some(0), "{shown}");
    let fields: Vec<(&str, &str)> = shown
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
            .unwrap_or_else(|| panic!("no {name} in:\n{shown}"))
    };
    assert_eq!(field("outbox_id"), row.id.to_string());
    assert_eq!(field("student"), student);
    assert_eq!(field("effect"), "create-user");
    assert_eq!(field("status"), "done");
    assert_eq!(field("attempts"), row.attempts.to_string());
    assert_eq!(field("idempotency_key"), row.idempotency_key);
    assert_eq!(field("result"), links[&row.aggregate_id].to_string());
    assert_eq!(field("error_code"), "-");
    assert!(!shown.contains("@example"), "no e-mail printed:\n{shown}");

    // `users-svc inbox show`: what Users saved for that row's key, the same user.
    let inbox = stack.users_command(&["inbox", "show", "--key", &row.idempotency_key]);
    let saved = String::from_utf8_lossy(&inbox.stdout);
    assert_eq!(inbox.status.code(), Some(0), "{saved}");
    let lines: Vec<&str> = saved.lines().collect();
    assert_eq!(lines.len(), 4, "{saved}");
    assert_eq!(lines[0], format!("idempotency_key {}", row.idempotency_key));
    let entry = users_svc::entity::inbox::Entity::find_by_id(row.idempotency_key.clone())
        .one(&stack.users_db)
        .await
        .expect("read the inbox")
        .expect("the key is in the inbox");
    assert_eq!(lines[1], format!("request_hash {}", entry.request_hash));
    assert_eq!(
        lines[2],
        format!(
            "created_at {}",
            entry
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        )
    );
    assert_eq!(
        lines[3],
        format!(
            r#"result {{"outcome":"created","user_id":"{}"}}"#,
            links[&row.aggregate_id]
        )
    );
    // A change's saved answer, and a saved rejection (code, reason, message: no value
    // of the request).
    let user_id = links[&row.aggregate_id];
    let applied = stack
        .users_client()
        .update_user(proto::users::v1::UpdateUserRequest {
            idempotency_key: "show-update".into(),
            student_id: student.clone(),
            first_name: "Renamed".into(),
            last_name: "Person".into(),
            email: "renamed@example.edu".into(),
            source_version: 2,
            user_id: user_id.to_string(),
        })
        .await
        .expect("applied")
        .into_inner();
    assert!(applied.applied);
    let rejected = stack
        .users_client()
        .create_user(conflicting_user_request(0))
        .await
        .expect_err("student 0's document number is taken");
    assert_eq!(rejected.code(), tonic::Code::AlreadyExists);
    let result_of = |key: &str| {
        let inbox = stack.users_command(&["inbox", "show", "--key", key]);
        let saved = String::from_utf8_lossy(&inbox.stdout).into_owned();
        assert_eq!(inbox.status.code(), Some(0), "{saved}");
        let result = saved
            .lines()
            .find_map(|line| line.strip_prefix("result "))
            .unwrap_or_else(|| panic!("no result in {saved}"));
        serde_json::from_str::<serde_json::Value>(result).expect("a JSON result")
    };
    assert_eq!(
        result_of("show-update"),
        serde_json::json!({"outcome": "applied", "user_id": user_id, "applied": true})
    );
    let rejection = result_of(&conflicting_user_request(0).idempotency_key);
    assert_eq!(
        (
            &rejection["outcome"],
            &rejection["code"],
            &rejection["reason"]
        ),
        (
            &serde_json::json!("rejected"),
            &serde_json::json!(tonic::Code::AlreadyExists as i32),
            &serde_json::json!("DOCUMENT_NUMBER_TAKEN")
        ),
        "{rejection}"
    );
    let message = rejection["message"].as_str().expect("a message");
    let document_number = crate::support::student_request(0).document_number;
    assert!(
        !message.is_empty() && !message.contains(&document_number) && !message.contains('@'),
        "names no value of the request: {message}"
    );

    // Nothing to show is the answer "no" (exit 1), not an error (2).
    let inbox = stack.users_command(&["inbox", "show", "--key", "never-sent"]);
    assert_eq!(inbox.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&inbox.stderr).contains("no inbox entry for key never-sent"));

    let unknown = uuid::Uuid::nil().to_string();
    let show = stack.relay_command(&["show", "--student", &unknown]);
    assert_eq!(show.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&show.stderr).contains("no outbox row for student"),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
}

/// Each binary runs on one thread by default (README, "One thread per relay" and "One
/// thread per service"): once students are linked, each process has its main thread, the
/// thread that writes its log (README, "Logs") and, on SQLite, sqlx's connection threads,
/// and no thread of a multi-threaded Tokio runtime.
async fn every_binary_runs_on_one_thread(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..20).await;
    stack.wait_until_all_linked(20).await;
    let processes = [
        (stack.relays[0].pid(), "relay"),
        (stack.student.pid(), "student-svc"),
        (stack.users.pid(), "users-svc"),
    ];
    for (pid, name) in processes {
        assert_eq!(threads_of(pid), [name, "log-writer"], "threads of {name}");
    }

    // Given more, a service runs its tasks on that many workers, and serves as before.
    stack
        .restart_student_with(None, &["--worker-threads", "2"])
        .await;
    stack
        .restart_users_with(None, &["--worker-threads", "2"])
        .await;
    stack.create_students(20..40).await;
    stack.wait_until_all_linked(40).await;
    let processes = [
        (stack.student.pid(), "student-svc"),
        (stack.users.pid(), "users-svc"),
    ];
    for (pid, name) in processes {
        let mut threads = threads_of(pid);
        threads.sort();
        let mut expected = [name, "log-writer", "tokio-rt-worker", "tokio-rt-worker"];
        expected.sort();
        assert_eq!(threads, expected, "threads of {name}");
    }
}

/// README: `RUST_LOG` defaults to `info`; `RUST_LOG=warn,listening=info` keeps each
/// service's `addr=` line (what devstack and loadgen read to find a service on port 0)
/// and quiets every other info line, such as each user's `user created`.
async fn rust_log_defaults_to_info_and_warn_with_listening_keeps_only_the_addr_line(
    backend: Backend,
) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let quiet = [("RUST_LOG".to_owned(), "warn,listening=info".to_owned())];
    for (n, env) in [&[][..], &quiet[..]].into_iter().enumerate() {
        let log = dbs.dir.path().join(format!("users-svc-{n}.log"));
        let args = ["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url];
        let mut users = Process::spawn_isolated(
            &binaries().join("users-svc"),
            &args.map(str::to_owned),
            env,
            &log,
        )
        .expect("start users-svc");
        let addr = users
            .listening_addr(Duration::from_secs(30))
            .expect("the addr= line");
        wait_until_serving(addr, "users.v1.UsersService", Duration::from_secs(30))
            .await
            .expect("serving");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy();
        proto::users::v1::users_service_client::UsersServiceClient::new(channel)
            .create_user(conflicting_user_request(n))
            .await
            .expect("created");
        users.signal(Signal::SIGTERM).expect("SIGTERM");
        let status = users
            .wait_timeout(Duration::from_secs(30))
            .expect("wait")
            .expect("users-svc stops");
        assert!(status.success(), "{status}");
        let logged = std::fs::read_to_string(&log).expect("its log");
        let info: Vec<&str> = logged
            .lines()
            .filter(|line| line.contains(" INFO "))
            .collect();
        if env.is_empty() {
            assert!(
                info.iter().any(|line| line.contains("user created")),
                "{logged}"
            );
        } else {
            assert!(
                info.len() == 1 && info[0].contains(" listening: users-svc listening addr="),
                "{logged}"
            );
        }
    }
}

/// README ("Logs"): a service's log lines are written by a thread of their own, so a
/// reader of stderr that stops reading (a stalled log shipper: the pipe fills) stops no
/// call. users-svc logs at `trace` into a pipe this test reads only up to the `addr=`
/// line; 300 CreateUser calls (tens of thousands of lines: more than the pipe and the
/// writer's queue hold) each answer within 10 s, every user is stored, the lines that did
/// not fit are counted in `log_lines_dropped_total`, and SIGTERM still stops it cleanly
/// and soon, though its stdout is that same full pipe and the writer is stuck in a write
/// to it (the process stops waiting for the writer after about a second). With the lines
/// written by the code that logs, the first call past a full pipe never answers.
async fn a_log_reader_that_stops_reading_stops_no_service(backend: Backend) {
    use std::io::BufRead as _;

    const CALLS: usize = 300;
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    // stdout and stderr into one pipe, as a container runtime or journald takes both.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    // A second way into the pipe, opened anew so that its flags (non-blocking, below) are
    // its own and not users-svc's.
    let filler = std::fs::OpenOptions::new()
        .write(true)
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&writer)
        ))
        .expect("the pipe, opened again");
    let mut users = tokio::process::Command::new(binaries().join("users-svc"))
        .args(["--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .args(["--database-url", &dbs.users_url])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "trace")
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().expect("the pipe again"))
        .stderr(writer)
        .kill_on_drop(true)
        .spawn()
        .expect("start users-svc");
    // Read up to the `addr=` line (the `metrics_addr=` line comes first), then never again:
    // the pipe stays open, unread, until the test ends.
    let mut log = std::io::BufReader::new(reader).lines();
    let (mut metrics_addr, mut addr) = (None, None);
    while addr.is_none() {
        let line = log
            .next()
            .expect("users-svc exited before listening")
            .expect("read the log");
        let value_of = |key: &str| -> Option<std::net::SocketAddr> {
            let rest = &line[line.find(key)? + key.len()..];
            rest.split_whitespace().next()?.parse().ok()
        };
        metrics_addr = metrics_addr.or_else(|| value_of(" metrics_addr="));
        addr = value_of(" addr=");
    }
    let (addr, metrics_addr) = (addr.expect("read"), metrics_addr.expect("logged first"));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let mut client = proto::users::v1::users_service_client::UsersServiceClient::new(channel);
    for n in 0..CALLS {
        let request = proto::users::v1::CreateUserRequest {
            idempotency_key: format!("log-reader-{n}"),
            email: format!("reader{n}@example.edu"),
            first_name: "Log".to_owned(),
            last_name: "Reader".to_owned(),
            document_number: format!("LOG-{n:05}"),
            student_id: uuid::Uuid::now_v7().to_string(),
        };
        tokio::time::timeout(Duration::from_secs(10), client.create_user(request))
            .await
            .unwrap_or_else(|_| panic!("call {n} did not answer within 10 s"))
            .unwrap_or_else(|status| panic!("call {n}: {status:?}"));
    }
    let users_db = sea_orm::Database::connect(&dbs.users_url)
        .await
        .expect("Users DB");
    assert_eq!(
        users_and_inbox_rows(&users_db).await,
        (CALLS as u64, CALLS as u64)
    );
    let dropped = sample(&scrape(metrics_addr).await, "log_lines_dropped_total", &[]);
    assert!(dropped > 0.0, "no log line dropped: the pipe never filled");

    // The pipe is full, but for the last bytes of a line users-svc waits to write: this
    // test takes those too, so that not one byte more fits when it stops.
    nix::fcntl::fcntl(
        &filler,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .expect("a non-blocking end");
    let mut filler = filler;
    while std::io::Write::write(&mut filler, b"x").is_ok() {}

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(users.id().expect("running")).expect("pid")),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    // The writer gives the stalled reader 1.2 s, then lets the rest go: the process is
    // gone well within 10 s (a writer that waited for the reader would hold it forever).
    let status = tokio::time::timeout(Duration::from_secs(10), users.wait())
        .await
        .expect("users-svc stops within 10 s")
        .expect("wait");
    assert!(status.success(), "{status}");
    drop(log);
}

/// The names of a process's threads, without sqlx's SQLite connection threads (each
/// SQLite connection runs on a thread of its own, outside the runtime).
fn threads_of(pid: u32) -> Vec<String> {
    let mut threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process's threads")
        .map(|task| {
            let comm = task.expect("a thread").path().join("comm");
            std::fs::read_to_string(comm)
                .expect("its name")
                .trim()
                .to_owned()
        })
        .collect();
    threads.retain(|name| !name.starts_with("sqlx-sqlite"));
    threads
}

/// Twelve rows waiting when a relay starts with `--rows-per-call 4` reach Users as three
/// CreateUsers calls and no CreateUser call (Users' own count of the calls it served), and
/// the answers of a call are recorded together (the finalizer's group commit); with
/// `--rows-per-call 1`, three more rows are three CreateUser calls.
async fn waiting_create_user_rows_go_to_users_many_to_a_call(backend: Backend) {
    let Some(mut stack) = Stack::start_with_metrics(backend).await else {
        return;
    };
    let users_metrics = stack.metrics_addr("users-svc").await;
    let served = |text: &str, method: &str| {
        sample(
            text,
            "grpc_server_handled_total",
            &[
                ("grpc_service", "users.v1.UsersService"),
                ("grpc_method", method),
                ("grpc_code", "OK"),
            ],
        )
    };
    stack.kill_relays();
    stack.create_students(0..12).await;
    stack.start_relay(
        None,
        &["--rows-per-call", "4", "--metrics-addr", "127.0.0.1:0"],
    );
    let relay_metrics = stack.metrics_addr("relay-1").await;
    stack.wait_until_all_linked(12).await;
    let text = scrape(users_metrics).await;
    assert_eq!(
        (served(&text, "CreateUsers"), served(&text, "CreateUser")),
        (3.0, 0.0),
        "{text}"
    );
    // A call's four answers reach the finalizer together: recorded in set-based batches,
    // fewer batches than rows (one transaction per row would be twelve `alone`).
    let relay = scrape(relay_metrics).await;
    let batches = |path| sample(&relay, "relay_finalize_batches_total", &[("path", path)]);
    assert!(batches("set") >= 1.0, "{relay}");
    assert!(batches("alone") + batches("set") < 12.0, "{relay}");

    stack.kill_relays();
    stack.create_students(12..15).await;
    stack.start_relay(None, &["--rows-per-call", "1"]);
    stack.wait_until_all_linked(15).await;
    let text = scrape(users_metrics).await;
    assert_eq!(
        (served(&text, "CreateUsers"), served(&text, "CreateUser")),
        (3.0, 3.0),
        "{text}"
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 15).await;
    stack.assert_audit_clean(15);
}

async fn a_relay_killed_mid_delivery_and_restarted_loses_and_duplicates_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    // A backlog far larger than one batch, then a relay killed with SIGKILL right after its
    // first link: it dies holding calls in flight, some answered by Users but not recorded.
    stack.kill_relays();
    let total = 200;
    stack.create_students(0..total).await;
    assert_eq!(stack.linked_students().await, 0, "no relay, no links");
    stack.start_relay(None, &[]);
    while stack.linked_students().await == 0 {
        stack.assert_running();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stack.kill_relays();
    let linked_at_kill = stack.linked_students().await;
    let (users_at_kill, _) = users_and_inbox_rows(&stack.users_db).await;
    assert!(
        linked_at_kill < total as u64,
        "the relay died with work left ({linked_at_kill} of {total} linked)"
    );
    assert!(users_at_kill >= linked_at_kill);
    eprintln!("killed the relay with {linked_at_kill} linked and {users_at_kill} users created");

    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(total as u64).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, total).await;
}

async fn users_svc_killed_and_restarted_delays_but_loses_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..5).await;
    stack.wait_until_all_linked(5).await;

    stack.kill_users();
    stack.create_students(5..15).await;
    // The relay keeps trying: wait until every new row has failed several attempts, then
    // check that none gave up.
    let rows = eventually(
        "three failed attempts on every row while Users is down",
        LINK_DEADLINE,
        || async {
            let rows = outbox::Entity::find()
                .filter(outbox::Column::Attempts.gte(3))
                .all(&stack.student_db)
                .await
                .expect("outbox");
            (rows.len() == 10).then_some(rows)
        },
    )
    .await;
    for row in &rows {
        assert!(
            row.status != outbox::OutboxStatus::Failed && row.failure_kind.is_none(),
            "a Users outage fails no row: {row:?}"
        );
    }
    assert_eq!(stack.linked_students().await, 5);

    stack.restart_users(None).await;
    stack.wait_until_all_linked(15).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 15).await;
}

/// SIGTERM (what an orchestrator sends) and SIGINT (Ctrl-C in a terminal) each stop every
/// binary with exit status 0, saying which signal it got.
async fn sigterm_and_ctrl_c_stop_every_binary_cleanly(backend: Backend) {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let Some(mut stack) = Stack::start(backend).await else {
            return;
        };
        stack.create_students(0..3).await;
        stack.wait_until_all_linked(3).await;
        let ended = stack.signal_all(signal, Duration::from_secs(15));
        let names: Vec<&str> = ended.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["relay", "student-svc", "users-svc"]);
        for (name, status) in ended {
            let status =
                status.unwrap_or_else(|| panic!("{name} still running 15 s after {signal}"));
            assert!(
                status.success(),
                "{name} exited with {status} after {signal}"
            );
        }
        for name in ["relay-0", "student-svc", "users-svc"] {
            let said = format!("shutting down signal=\"{signal}\"");
            assert!(stack.log_of(name).contains(&said), "{name} logs {said}");
        }
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 3).await;
    }
}

async fn sigterm_lets_a_relay_finish_the_calls_it_has_in_flight(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Each call takes 700 ms, inside the relay's 1 s deadline.
    stack
        .restart_users(Some(&format!("{}=sleep(700)", points::USERS_ON_REQUEST)))
        .await;
    stack.create_students(0..6).await;
    // Three calls of two rows each.
    stack.start_relay(None, &["--rows-per-call", "2"]);
    stack
        .wait_for_log_lines("users-svc", "fail point: sleeping", 3)
        .await;
    // Every row is in a call now. SIGTERM: no new claims, the calls finish and are recorded.
    stack.stop_relays(Duration::from_secs(15));
    let rows = stack.outbox_rows().await;
    assert!(
        rows.iter()
            .all(|row| row.status == OutboxStatus::Done && row.locked_by.is_none()),
        "every call in flight was finished and recorded, nothing left leased: {rows:?}"
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 6).await;
}

/// SIGTERM while a relay's claim is under way (a `sleep` fail point just after it): the
/// relay sends none of the rows it claimed, hands them back with their attempt unused, and
/// exits 0. Another relay links them at once, not after the stopped relay's 5-minute lease.
async fn sigterm_during_a_claim_hands_its_rows_back_unsent(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..3).await;
    let slow_claim = format!("{}=1*sleep(2000)", points::RELAY_AFTER_CLAIM);
    stack.start_relay(Some(&slow_claim), &["--lease", "300s"]);
    stack
        .wait_for_relay_log_lines("fail point: sleeping", 1)
        .await;
    stack.stop_relays(Duration::from_secs(15));
    let rows = stack.outbox_rows().await;
    assert_eq!(rows.len(), 3);
    for row in &rows {
        assert_eq!(
            (row.status, row.attempts, row.locked_by.as_deref()),
            (OutboxStatus::Pending, 0, None),
            "handed back as if never claimed: {row:?}"
        );
    }
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (0, 0),
        "nothing was sent"
    );
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(3).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 3).await;
}

async fn a_request_past_the_server_timeout_is_cancelled_and_stores_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // The handler would commit 1.5 s after it starts; the server gives up after 500 ms.
    let would_commit_after = Duration::from_millis(1500);
    let slow = format!(
        "{}=sleep({})",
        points::USERS_BEFORE_COMMIT,
        would_commit_after.as_millis()
    );
    stack
        .restart_users_with(
            Some(&slow),
            &[
                "--request-timeout",
                "500ms",
                "--metrics-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", stack.users_addr))
        .expect("endpoint")
        .connect_lazy();
    let sent = tokio::time::Instant::now();
    let status = proto::users::v1::users_service_client::UsersServiceClient::new(channel)
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "slow".into(),
            email: "ana@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: "DOC-1".into(),
            student_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("the server gives up after its timeout");
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    // The handler reached its write before it was cancelled (on SQLite, inside its
    // transaction; on PostgreSQL, just before its one statement)...
    stack
        .wait_for_log_lines("users-svc", "fail point: sleeping", 1)
        .await;
    // ...and had it not been dropped, it would have committed by now. It was dropped:
    // nothing stored.
    tokio::time::sleep_until(sent + would_commit_after + Duration::from_millis(500)).await;
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (0, 0));
    assert!(!stack.log_of("users-svc").contains("user created"));
    stack.assert_running();
    // Counted by its code, as every call answered is.
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    let handled = |code| {
        let labels = [
            ("grpc_service", "users.v1.UsersService"),
            ("grpc_method", "CreateUser"),
            ("grpc_code", code),
        ];
        sample(&users, "grpc_server_handled_total", &labels)
    };
    assert_eq!((handled("CANCELLED"), handled("OK")), (1.0, 0.0), "{users}");
}

async fn two_replicas_migrating_one_empty_database_at_once_both_serve(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    for (binary, url, service, applied) in [
        (
            "student-svc",
            &dbs.student_url,
            "student.v1.StudentService",
            student_migrations(),
        ),
        (
            "users-svc",
            &dbs.users_url,
            "users.v1.UsersService",
            users_migrations(),
        ),
    ] {
        let args: Vec<String> = ["--listen", "127.0.0.1:0", "--database-url", url]
            .map(str::to_owned)
            .to_vec();
        // Both start before either has touched the empty database.
        let mut replicas: Vec<Process> = (0..2)
            .map(|n| {
                Process::spawn_isolated(
                    &binaries().join(binary),
                    &args,
                    &[("RUST_LOG".to_owned(), "info".to_owned())],
                    &dbs.dir.path().join(format!("{binary}-{n}.log")),
                )
                .expect("start replica")
            })
            .collect();
        for replica in &mut replicas {
            let addr = replica
                .listening_addr(Duration::from_secs(60))
                .unwrap_or_else(|err| panic!("{binary} replica serves: {err:#}"));
            wait_until_serving(addr, service, Duration::from_secs(30))
                .await
                .expect("healthy");
        }
        let db = platform::db::connect(url).await.expect("connect");
        let recorded = db
            .query_all_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                "SELECT version FROM seaql_migrations ORDER BY version",
            ))
            .await
            .expect("migration records");
        let versions: Vec<String> = recorded
            .iter()
            .map(|row| row.try_get("", "version").expect("version"))
            .collect();
        assert_eq!(versions, applied, "{binary}: each migration applied once");
    }
}

/// The one-shot commands never migrate (README): on a database no service has started on
/// yet, each fails as an error (exit 2, as every one-shot command's errors do) naming the
/// service to start first, and leaves no table behind.
async fn one_shot_commands_on_a_database_with_no_schema_say_which_service_to_start(
    backend: Backend,
) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    // A one-shot command with `env` as its only environment.
    let run = |binary: &str, env: &[(&str, &str)], args: &[&str]| {
        std::process::Command::new(binaries().join(binary))
            .env_clear()
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("run {binary}: {err}"))
    };
    let users_svc =
        |args: &[&str]| run("users-svc", &[("USERS_DATABASE_URL", &dbs.users_url)], args);
    let relay = |args: &[&str]| run("relay", &[("STUDENT_DATABASE_URL", &dbs.student_url)], args);
    let relay_flags = |args: &[&str]| run("relay", &[], args);
    for (output, service) in [
        (users_svc(&["inbox", "show", "--key", "k"]), "users-svc"),
        (
            users_svc(&["--inbox-retention", "30d", "inbox", "purge"]),
            "users-svc",
        ),
        (relay(&["status"]), "student-svc"),
        (relay(&["purge"]), "student-svc"),
        (relay(&["replay", "--all"]), "student-svc"),
        (relay(&["audit"]), "student-svc"),
        (relay(&["retry-failed", "--all"]), "student-svc"),
        (
            relay(&["show", "--student", &uuid::Uuid::nil().to_string()]),
            "student-svc",
        ),
        // The relay's flags are global, and a flag given twice takes its last value: each
        // of these reads the test's database, not the (unreachable) one named first.
        (
            relay_flags(&["--database-url", &dbs.student_url, "status"]),
            "student-svc",
        ),
        (
            relay_flags(&["status", "--database-url", &dbs.student_url]),
            "student-svc",
        ),
        (
            relay_flags(&[
                "status",
                "--database-url",
                "postgres://nobody@127.0.0.1:1/none",
                "--database-url",
                &dbs.student_url,
            ]),
            "student-svc",
        ),
    ] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "an error: {stderr}");
        assert!(
            stderr.contains(&format!("has no schema yet: start {service} first")),
            "{stderr}"
        );
    }
    for url in [&dbs.student_url, &dbs.users_url] {
        let db = platform::db::connect(url).await.expect("connect");
        let tables = match backend {
            Backend::Sqlite => "SELECT count(*) AS n FROM sqlite_master WHERE type = 'table'",
            Backend::Postgres => {
                "SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'public'"
            }
        };
        let n: i64 = db
            .query_one_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                tables,
            ))
            .await
            .expect("count tables")
            .expect("a row")
            .try_get("", "n")
            .expect("n");
        assert_eq!(n, 0, "{url}: nothing was migrated");
    }
}

/// A relay may start before student-svc has made the Student DB's schema: it waits, and a
/// SIGTERM while it waits stops it cleanly at once, as it would a running one.
async fn a_relay_waiting_for_the_student_db_stops_when_told(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let mut relay = Process::spawn_isolated(
        &binaries().join("relay"),
        &["run".to_owned()],
        &[("STUDENT_DATABASE_URL".to_owned(), dbs.student_url.clone())],
        &dbs.dir.path().join("relay.log"),
    )
    .expect("start the relay");
    wait_for_log_lines(&dbs, "relay", RELAY_WAITS_FOR_THE_SCHEMA, 1).await;
    relay.signal(Signal::SIGTERM).expect("SIGTERM");
    let status = relay
        .wait_timeout(Duration::from_secs(5))
        .expect("wait")
        .expect("the waiting relay stops when told");
    assert!(status.success(), "{status}");
}

/// README ("Configuration", `--lease`; "How the relay claims"): `relay run`, and a bare
/// `relay` from its `RELAY_*` variables, refuse at start a tuning under which a call could
/// outlast its row's lease (every claimed row would be handed back unsent, forever) or whose
/// backoff would start above its cap: exit 2 naming the rule. The Student DB is ready, so a
/// relay that skipped the check would start and run instead (the deadline below).
async fn a_relay_tuned_against_its_own_rules_refuses_to_start(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    migrations::open::<migrations::student::Migrator>(&dbs.student_url, 1)
        .await
        .expect("the Student DB migrated");
    // (arguments, environment, the rule the refusal names)
    type Case = (
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            &["run", "--call-timeout", "12s"],
            &[],
            "--lease (15s) must be at least --call-timeout (12s) plus 6s",
        ),
        (
            &["run", "--lease", "1s", "--call-timeout", "1s"],
            &[],
            "--lease (1s) must be at least --call-timeout (1s) plus 500ms",
        ),
        (
            &[],
            &[("RELAY_LEASE", "1s"), ("RELAY_CALL_TIMEOUT", "1s")],
            "--lease (1s) must be at least --call-timeout (1s) plus 500ms",
        ),
        (
            &[],
            &[("RELAY_BACKOFF_BASE", "31s")],
            "--backoff-base (31s) must not exceed --backoff-max (30s)",
        ),
    ];
    for (args, env, rule) in cases {
        let output = exits_within_30_s(
            tokio::process::Command::new(binaries().join("relay"))
                .env_clear()
                .env("STUDENT_DATABASE_URL", &dbs.student_url)
                .envs(env.iter().copied())
                .args(args),
            &format!("{args:?} {env:?}: the relay refusing its tuning"),
        )
        .await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains(&format!("error: {rule}")),
            "{args:?} {env:?}: {stderr}"
        );
    }
}

/// `users-svc inbox purge` deletes, now, the inbox keys older than `--inbox-retention`,
/// prints `purged=N`, and keeps the users and the younger keys.
async fn inbox_purge_deletes_keys_past_the_retention_now_and_keeps_the_users(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    let purge = |retention: &str| {
        let output = stack.users_command(&["--inbox-retention", retention, "inbox", "purge"]);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stdout}");
        stdout
            .strip_prefix("purged=")
            .and_then(|n| n.strip_suffix('\n'))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("not a purge count: {stdout:?}"))
    };
    assert_eq!(purge("1h"), 0, "both keys are younger than an hour");
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (2, 2));
    // The retention must be stated: the default is not assumed, since a purge shorter than
    // the servers' retention deletes keys they would execute again.
    let unstated = stack.users_command(&["inbox", "purge"]);
    assert_eq!(unstated.status.code(), Some(2), "{unstated:?}");
    assert!(
        String::from_utf8_lossy(&unstated.stderr)
            .contains("inbox purge needs the servers' retention"),
        "{unstated:?}"
    );
    let from_variable =
        stack.users_command_with(&["inbox", "purge"], &[("USERS_INBOX_RETENTION", "1h")]);
    assert_eq!(
        (
            from_variable.status.code(),
            String::from_utf8_lossy(&from_variable.stdout)
        ),
        (Some(0), "purged=0\n".into())
    );
    // Once both keys are over a second old, a purge with a one-second retention takes them.
    let mut purged = 0;
    eventually("both keys purged", LINK_DEADLINE, || {
        purged += purge("1s");
        let done = purged >= 2;
        async move { done.then_some(()) }
    })
    .await;
    assert_eq!(purged, 2);
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (2, 0));
    assert_eq!(purge("1s"), 0);
}

fn student_migrations() -> Vec<String> {
    use sea_orm_migration::MigratorTrait as _;
    migrations::student::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

fn users_migrations() -> Vec<String> {
    use sea_orm_migration::MigratorTrait as _;
    migrations::users::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

/// README, "Wake-up": a relay whose wake-ups (PostgreSQL's LISTEN connection, SQLite's
/// watcher) cannot be set up at start, or are lost while it runs, says so on
/// `relay_wakeups_listening`, keeps trying with backoff (eight tries fail here, as while the
/// database is unreachable: 21.3 s), and once they are back claims what was committed
/// while nothing woke it. Each relay polls every 300 s, so only that wake-up links the
/// student committed meanwhile in time.
async fn a_relay_whose_wake_ups_fail_gets_them_back_and_claims_what_it_missed(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Tries that fail before one works: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5 + 5 + 5 s
    // without wake-ups, for the test to commit a student in.
    const FAILING_TRIES: u32 = 8;
    let retries_fail = format!("{}={FAILING_TRIES}*error", points::RELAY_WAKEUPS_RETRY);
    for (relay, lose) in [
        (1, points::RELAY_WAKEUPS_START),
        (2, points::RELAY_WAKEUPS_LOST),
    ] {
        let linked = stack.linked_students().await as usize;
        // Waiting before the relay starts: its first claim, which nothing needs to wake,
        // takes it, and the relay is idle after.
        stack.create_students(linked..linked + 1).await;
        // Calls that outlast a stalled machine: a first call timed out would leave its row
        // to the next claim, which only the wake-ups' return would bring.
        stack.start_relay(
            Some(&format!("{lose}=1*error;{retries_fail}")),
            &[
                CALLS_OUTLAST_A_STALL,
                &["--poll-interval", "300s", "--metrics-addr", "127.0.0.1:0"],
            ]
            .concat(),
        );
        stack.wait_until_all_linked(linked as u64 + 1).await;
        let relay_metrics = stack.metrics_addr(&format!("relay-{relay}")).await;
        let listening = || wakeups_listening(relay_metrics);
        let losses = || async { gauge(&scrape(relay_metrics).await, "relay_wakeup_losses_total") };

        stack.create_students(linked + 1..linked + 2).await;
        // Read after the commit: the student was committed while nothing woke the relay.
        assert_eq!(
            listening().await,
            0.0,
            "{lose}: the wake-ups came back before the test could commit a student without them"
        );
        eventually("the wake-ups back", LINK_DEADLINE, || async {
            (listening().await == 1.0).then_some(())
        })
        .await;
        // One loss, however many tries it took to end.
        assert_eq!(losses().await, 1.0, "{lose}");
        stack.wait_until_all_linked(linked as u64 + 2).await;
        let log = stack.relay_log_of(relay);
        let said = |line: &str| {
            assert!(
                log.lines().any(|logged| logged.contains(line)),
                "{lose}: no {line:?} in the log:\n{log}"
            );
        };
        said(match lose {
            points::RELAY_WAKEUPS_START => "could not be set up; polling until it can",
            _ => "is lost; polling until it is back",
        });
        said(&format!(
            "is back: commits wake the relay again tries={}",
            FAILING_TRIES + 1
        ));
        stack.kill_relays();
    }
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
}

/// A relay's `relay_wakeups_listening` gauge, scraped from `addr`.
async fn wakeups_listening(addr: std::net::SocketAddr) -> f64 {
    gauge(&scrape(addr).await, "relay_wakeups_listening")
}

/// PostgreSQL only: a database cannot vanish from under an open SQLite file. The relay
/// backs off, growing, while its claims fail, and starts over once one works; its LISTEN
/// comes back with the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_student_database_going_away_and_coming_back_is_ridden_out() {
    let Some(mut stack) = Stack::start_with_metrics(Backend::Postgres).await else {
        return;
    };
    // A backoff base unlike the poll interval: the claim backoff must start from the poll
    // interval (--backoff-base is for rows).
    stack.kill_relays();
    stack.start_relay(
        None,
        &["--backoff-base", "70ms", "--metrics-addr", "127.0.0.1:0"],
    );
    let relay_metrics = stack.metrics_addr("relay-1").await;
    let listening = || wakeups_listening(relay_metrics);
    stack.create_students(0..3).await;
    stack.wait_until_all_linked(3).await;
    assert_eq!(listening().await, 1.0, "LISTENing");

    // Each claim that fails waits longer: --poll-interval (50 ms) doubling up to
    // --backoff-max (500 ms), as its log line says.
    let pauses = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|line| line.contains("claim failed"))
            .map(|line| {
                let rest = &line[line.find("retry_in=").expect("retry_in") + "retry_in=".len()..];
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    stack.dbs.set_student_database_reachable(false).await;
    let log = stack.wait_for_relay_log_lines("claim failed", 5).await;
    assert_eq!(
        pauses(&log)[..5],
        ["50ms", "100ms", "200ms", "400ms", "500ms"]
    );
    wait_for_health(stack.student_addr, ServingStatus::NotServing).await;
    // Its LISTEN connection ended too, and cannot be made again yet.
    stack
        .wait_for_relay_log_lines("the LISTEN connection is lost; polling until it is back", 1)
        .await;
    assert_eq!(
        listening().await,
        0.0,
        "polling only while the database is away"
    );

    stack.dbs.set_student_database_reachable(true).await;
    wait_for_health(stack.student_addr, ServingStatus::Serving).await;
    eventually("LISTENing again", LINK_DEADLINE, || async {
        (listening().await == 1.0).then_some(())
    })
    .await;
    // The relay backed off and resumes by itself: a new student is linked.
    stack.create_students(3..6).await;
    stack.wait_until_all_linked(6).await;

    // A claim that worked ended the streak: the next outage's first pause is 50 ms again.
    let before = pauses(&stack.relay_log()).len();
    stack.dbs.set_student_database_reachable(false).await;
    let log = stack
        .wait_for_relay_log_lines("claim failed", before + 1)
        .await;
    assert_eq!(pauses(&log)[before], "50ms", "a new outage, a new streak");
    wait_for_health(stack.student_addr, ServingStatus::NotServing).await;
    stack.dbs.set_student_database_reachable(true).await;
    wait_for_health(stack.student_addr, ServingStatus::Serving).await;
    stack.create_students(6..7).await;
    stack.wait_until_all_linked(7).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 7).await;
}

/// PostgreSQL only (README, "Running on PostgreSQL"): every binary opens at most
/// `--db-max-connections` connections to its database, a relay one more to LISTEN, and
/// PostgreSQL shows whose each is (`application_name`: the program's name, or the one the
/// URL gives). With the defaults, both services and eight relays working at once hold at
/// most 10 + 10 + 8 × (4 + 1) = 60 connections. The reads keep student-svc's pool full,
/// so its limit is reached, not just respected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_relays_and_both_services_keep_to_their_connection_budgets() {
    const STUDENTS: usize = 800;
    let Some(mut stack) = Stack::start(Backend::Postgres).await else {
        return;
    };
    // Relay 0 keeps the program's own name; the others are named by their URLs.
    let relays: Vec<String> = (1..8).map(|n| format!("relay-{n}")).collect();
    for name in &relays {
        stack.start_relay_named(name);
    }
    let mut budgets: Vec<(String, i64)> = vec![
        ("student-svc".to_owned(), 10),
        ("users-svc".to_owned(), 10),
        ("relay".to_owned(), 4 + 1),
    ];
    budgets.extend(relays.iter().map(|name| (name.clone(), 4 + 1)));
    let this_test = platform::db::program_name().expect("the test's own program name");

    // Every 10 ms until the work is done: each name's connections to the two databases.
    let databases = format!(
        "'{}', '{}'",
        database_name(&stack.student_db).await,
        database_name(&stack.users_db).await
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (db, stop) = (stack.student_db.clone(), stop.clone());
        async move {
            let mut most = std::collections::BTreeMap::<String, i64>::new();
            // A backend still starting up is listed before its `application_name` is set
            // (seen once in CI); a connection that stays unnamed is listed read after read.
            let mut unnamed_reads = 0;
            while !stop.is_cancelled() {
                let rows = db
                    .query_all_raw(sea_orm::Statement::from_string(
                        sea_orm::DbBackend::Postgres,
                        format!(
                            "SELECT application_name AS name, count(*) AS connections \
                             FROM pg_stat_activity WHERE datname IN ({databases}) GROUP BY 1"
                        ),
                    ))
                    .await
                    .expect("pg_stat_activity");
                let mut unnamed_now = false;
                for row in rows {
                    let name: String = row.try_get("", "name").expect("name");
                    let connections: i64 = row.try_get("", "connections").expect("count");
                    if name.is_empty() {
                        unnamed_now = true;
                        unnamed_reads += 1;
                        if unnamed_reads < 5 {
                            continue;
                        }
                    }
                    let seen = most.entry(name).or_default();
                    *seen = (*seen).max(connections);
                }
                if !unnamed_now {
                    unnamed_reads = 0;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            most
        }
    });

    // CreateStudents 32 at a time, each task reading students back as it goes.
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..32)
        .map(|_| {
            let (mut client, next) = (stack.student_client(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= STUDENTS {
                        break;
                    }
                    let id = client
                        .create_student(crate::support::student_request(n))
                        .await
                        .expect("created")
                        .into_inner()
                        .id;
                    for _ in 0..3 {
                        client
                            .get_student(GetStudentRequest { id: id.clone() })
                            .await
                            .expect("read back");
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    stack.wait_until_all_linked(STUDENTS as u64).await;
    stop.cancel();
    let most = sampler.await.expect("sampler");
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, STUDENTS).await;

    let mut total = 0;
    for (name, budget) in &budgets {
        let held = most.get(name).copied().unwrap_or(0);
        assert!(
            (1..=*budget).contains(&held),
            "{name} held {held} connections at most, its budget is {budget}: {most:?}"
        );
        total += held;
    }
    assert!(total <= 60, "{total} connections at most: {most:?}");
    assert_eq!(most["student-svc"], 10, "the reads fill its pool: {most:?}");
    // Each relay's LISTEN connection is named too: nothing else is in these databases.
    for name in most.keys() {
        assert!(
            *name == this_test || budgets.iter().any(|(known, _)| known == name),
            "a connection named {name:?}: {most:?}"
        );
    }
}

/// PostgreSQL only (README, "Running on PostgreSQL"): `PGAPPNAME` names a binary's
/// connections instead of the program's name, and a URL's `application_name` wins over
/// both. Two relays wait for a schema that never comes, holding a connection meanwhile.
#[tokio::test]
async fn pgappname_names_the_connections_unless_the_url_does() {
    let Some(dbs) = TestDatabases::create(Backend::Postgres).await else {
        return;
    };
    let separator = if dbs.student_url.contains('?') {
        '&'
    } else {
        '?'
    };
    let named_by_url = format!("{}{separator}application_name=from-url", dbs.student_url);
    let _relays: Vec<Process> = [&dbs.student_url, &named_by_url]
        .into_iter()
        .enumerate()
        .map(|(n, url)| {
            let args = [
                "--database-url",
                url,
                "--users-url",
                "http://127.0.0.1:9",
                "run",
            ];
            Process::spawn_isolated(
                &binaries().join("relay"),
                &args.map(str::to_owned),
                &[("PGAPPNAME".to_owned(), "from-env".to_owned())],
                &dbs.dir.path().join(format!("relay-{n}.log")),
            )
            .expect("start a relay")
        })
        .collect();
    let db = platform::db::connect(&dbs.student_url)
        .await
        .expect("connect");
    let query = format!(
        "SELECT DISTINCT application_name AS name FROM pg_stat_activity \
         WHERE datname = '{}' AND application_name <> '{}'",
        database_name(&db).await,
        platform::db::program_name().expect("the test's own program name"),
    );
    let names = eventually("both relays connected", LINK_DEADLINE, || async {
        let rows = db
            .query_all_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                query.clone(),
            ))
            .await
            .expect("pg_stat_activity");
        let names: std::collections::BTreeSet<String> = rows
            .iter()
            .map(|row| row.try_get("", "name").expect("name"))
            .collect();
        (names.len() >= 2).then_some(names)
    })
    .await;
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["from-env", "from-url"],
        "not the program's name, `relay`"
    );
}

async fn database_name(db: &sea_orm::DatabaseConnection) -> String {
    db.query_one_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        "SELECT current_database() AS name",
    ))
    .await
    .expect("current_database()")
    .expect("a row")
    .try_get("", "name")
    .expect("its name")
}

async fn wait_for_health(addr: std::net::SocketAddr, expected: ServingStatus) {
    eventually(
        &format!("student-svc health {expected:?}"),
        LINK_DEADLINE,
        || async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .ok()?
                .connect()
                .await
                .ok()?;
            let status = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: "student.v1.StudentService".into(),
                })
                .await
                .ok()?
                .into_inner()
                .status();
            (status == expected).then_some(())
        },
    )
    .await;
}

/// README ("Sequence"): no transaction is ever held open across the call to Users. Users
/// holds each call for 5 s (the relay's deadline is longer), and while a call waits there
/// the Student DB shows no relay transaction: on PostgreSQL no relay connection is `idle in
/// transaction`; on SQLite a write transaction of the test's own takes the write lock
/// within half a second (the relay's claims, which go on meanwhile, hold it for a moment
/// each; a write transaction held across the call would hold it for the whole 5 s). SQLite
/// shows only a write transaction so: a read one held across the call would go unseen.
async fn no_transaction_is_held_open_across_the_call_to_users(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack
        .restart_users(Some("users-on-request=1*sleep(5000)"))
        .await;
    stack.start_relay(None, CALLS_OUTLAST_A_STALL);
    stack.create_students(0..1).await;
    stack
        .wait_for_log_lines("users-svc", "fail point: sleeping", 1)
        .await;
    match backend {
        Backend::Postgres => {
            let relay_connections = |state: &str| {
                sea_orm::Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    format!(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = \
                         current_database() AND application_name = 'relay' {state}"
                    ),
                )
            };
            let count = |statement| async {
                let row = stack
                    .student_db
                    .query_one_raw(statement)
                    .await
                    .expect("pg_stat_activity")
                    .expect("a row");
                row.try_get_by_index::<i64>(0).expect("a count")
            };
            assert!(
                count(relay_connections("")).await > 0,
                "the relay is connected"
            );
            assert_eq!(
                count(relay_connections("AND state LIKE 'idle in transaction%'")).await,
                0,
                "a relay transaction open while its call waits in Users"
            );
        }
        Backend::Sqlite => {
            let options = sea_orm::ConnectOptions::new(stack.dbs.student_url.clone())
                .max_connections(1)
                .to_owned();
            let probe = sea_orm::Database::connect(options).await.expect("connect");
            probe
                .execute_unprepared("PRAGMA busy_timeout = 500")
                .await
                .expect("half a second at most");
            probe
                .execute_unprepared("BEGIN IMMEDIATE")
                .await
                .expect("the write lock is free while the call waits in Users");
            probe
                .execute_unprepared("ROLLBACK")
                .await
                .expect("rollback");
        }
    }
    stack.wait_until_all_linked(1).await;
}

/// README ("Fail points"): `users-on-request` is hit by every Users write, CreateUser,
/// CreateUsers, UpdateUser and DisableUser, on arrival: held there past the server's
/// timeout, each is cancelled. (That a cancelled write stores nothing is
/// `a_request_past_the_server_timeout_is_cancelled_and_stores_nothing`.)
async fn every_users_write_passes_the_on_request_fail_point(backend: Backend) {
    use proto::users::v1::{
        CreateUserRequest, CreateUsersItem, CreateUsersRequest, DisableUserRequest,
        UpdateUserRequest,
    };
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    let held = format!("{}=sleep(3000)", points::USERS_ON_REQUEST);
    stack
        .restart_users_with(Some(&held), &["--request-timeout", "1s"])
        .await;
    let mut users = stack.users_client();
    let student_id = uuid::Uuid::now_v7().to_string();
    let create = CreateUserRequest {
        idempotency_key: "create".into(),
        email: "ana@example.edu".into(),
        first_name: "Ana".into(),
        last_name: "Pérez".into(),
        document_number: "DOC-1".into(),
        student_id: student_id.clone(),
    };
    let codes = [
        users.create_user(create.clone()).await.map(|_| ()),
        users
            .create_users(CreateUsersRequest {
                items: vec![CreateUsersItem {
                    user: Some(create),
                    ..CreateUsersItem::default()
                }],
            })
            .await
            .map(|_| ()),
        users
            .update_user(UpdateUserRequest {
                idempotency_key: "update".into(),
                student_id: student_id.clone(),
                first_name: "Eva".into(),
                last_name: "Pérez".into(),
                email: "ana@example.edu".into(),
                source_version: 2,
                user_id: String::new(),
            })
            .await
            .map(|_| ()),
        users
            .disable_user(DisableUserRequest {
                idempotency_key: "disable".into(),
                student_id,
                source_version: 3,
                user_id: String::new(),
            })
            .await
            .map(|_| ()),
    ]
    .map(|answer| answer.map_err(|status| status.code()));
    assert_eq!(codes, [Err(tonic::Code::Cancelled); 4]);
    stack
        .wait_for_log_lines("users-svc", "fail point: sleeping", 4)
        .await;
}

/// PostgreSQL only, as above: a relay whose host clock runs an hour behind hurries no row.
/// Its lease is the database's: stalled after its claim, the row it holds is leased past
/// the row's creation, not until an hour before it (when any other relay could take the
/// row at once and send it a second time). Its retries are due a backoff after the
/// database's now, not an hour before it (which would send them again at once, and again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_whose_clocks_run_behind_hurry_no_row() {
    let Some(mut stack) = Stack::start(Backend::Postgres).await else {
        return;
    };
    let an_hour_behind = "clock-skew=skew(-3600000)";
    stack.kill_relays();
    stack.start_relay(
        Some(&format!(
            "{an_hour_behind};{}=1*sleep(1500)",
            points::RELAY_AFTER_CLAIM
        )),
        &[],
    );
    stack.create_students(0..1).await;
    let held = eventually("the row claimed", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(0);
        (row.status == OutboxStatus::Processing).then_some(row)
    })
    .await;
    let leased_for = held.locked_until.expect("leased") - held.created_at;
    assert!(
        leased_for > chrono::TimeDelta::zero() && leased_for < chrono::TimeDelta::minutes(1),
        "leased until {leased_for} after the row was created"
    );
    stack.wait_until_all_linked(1).await;
    // The skew is real: the relay dated the row's delivery by its own clock, an hour
    // before the row was written.
    let done = stack.outbox_rows().await.remove(0);
    let dated = done.created_at - done.processed_at.expect("done");
    assert!(
        dated > chrono::TimeDelta::minutes(50),
        "processed_at {dated} before created_at: the relay's clock is not behind"
    );

    let due_in = a_retry_while_users_is_down(&mut stack, 1, 2).await;
    assert!(
        due_in > chrono::TimeDelta::zero() && due_in < chrono::TimeDelta::minutes(1),
        "due {due_in} after the row was created"
    );
}

/// PostgreSQL only: on SQLite every process shares one machine and one clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_whose_clocks_run_ahead_delay_no_row() {
    let Some(mut stack) = Stack::start(Backend::Postgres).await else {
        return;
    };
    let an_hour_ahead = "clock-skew=skew(3600000)";
    // A student-svc an hour ahead: its row is due by the database's clock, not its own.
    stack.restart_student(Some(an_hour_ahead)).await;
    stack.create_students(0..1).await;
    stack.wait_until_all_linked(1).await;
    // The skew is real: student-svc dated the student an hour after the database's clock
    // made the row due.
    let row = stack.outbox_rows().await.remove(0);
    let ahead = row.created_at - row.available_at;
    assert!(
        ahead > chrono::TimeDelta::minutes(50),
        "created_at only {ahead} after available_at: student-svc's clock is not ahead"
    );

    // retry-failed on a host an hour ahead: the redriven row is due at once too.
    stack
        .users_client()
        .create_user(crate::support::conflicting_user_request(1))
        .await
        .expect("someone else holds student 1's document number");
    stack.create_students(1..2).await;
    let failed = eventually("the row to be rejected", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(1);
        (row.status == OutboxStatus::Failed).then_some(row)
    })
    .await;
    let output = stack.relay_command_with(
        &["retry-failed", "--all", "--new-key"],
        &[("FAILPOINTS", an_hour_ahead)],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let judged = eventually(
        "the redriven row to be judged again",
        LINK_DEADLINE,
        || async {
            let row = stack.outbox_rows().await.remove(1);
            (row.status == OutboxStatus::Failed && row.idempotency_key != failed.idempotency_key)
                .then_some(row)
        },
    )
    .await;
    assert_eq!(judged.attempts, 1);

    // A relay an hour ahead, retrying while Users is down: each retry is due a backoff
    // after the database's now, not its own (an hour late), so the row is linked as soon
    // as Users is back.
    stack.kill_relays();
    stack.start_relay(Some(an_hour_ahead), &[]);
    // (`created_at` is the student-svc's clock here, an hour ahead too.)
    let due_in = a_retry_while_users_is_down(&mut stack, 2, 2).await;
    assert!(due_in < chrono::TimeDelta::minutes(1), "due in {due_in}");
}

/// With Users down, student `n` is created and its row retried by the running relay; once
/// Users is back, `linked` students are linked. Returns how long after the row's
/// `created_at` the retry was due.
async fn a_retry_while_users_is_down(
    stack: &mut Stack,
    n: usize,
    linked: u64,
) -> chrono::TimeDelta {
    stack.kill_users();
    stack.create_students(n..n + 1).await;
    let retried = eventually("the row to be retried", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(n);
        (row.status == OutboxStatus::Pending && row.attempts >= 1).then_some(row)
    })
    .await;
    stack.restart_users(None).await;
    stack.wait_until_all_linked(linked).await;
    retried.available_at - retried.created_at
}

/// The same fault for both flows: Users commits the user, then dies before answering, and
/// the client retries CreateStudent with its key once Users is back.
async fn direct_mode_loses_the_student_where_the_outbox_does_not(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let users_url = format!("http://{}", stack.users_addr);
    let answer_lost = format!("{}=1*abort", points::USERS_AFTER_COMMIT);
    let create = |n: usize| proto::student::v1::CreateStudentRequest {
        idempotency_key: Some(format!("enrol-{n}")),
        ..crate::support::student_request(n)
    };

    // The naive flow: student-svc calls Users itself, with a fresh key per attempt.
    stack
        .restart_student_with(None, &["--link-mode", "direct", "--users-url", &users_url])
        .await;
    stack.restart_users(Some(&answer_lost)).await;
    stack
        .student_client()
        .create_student(create(1))
        .await
        .expect_err("Users died before answering");
    stack.wait_for_users_abort();
    stack.restart_users(None).await;
    let retried = stack
        .student_client()
        .create_student(create(1))
        .await
        .expect_err("the retry is a new operation to Users, and its own user is in the way");
    assert_eq!(retried.code(), tonic::Code::AlreadyExists, "{retried:?}");
    // Lost: no student, and a user that belongs to no student, for good.
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (0, 0));
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (1, 2));

    // The outbox flow, the same fault, the same retry: one student, linked to one user.
    stack.restart_student(None).await;
    stack.restart_users(Some(&answer_lost)).await;
    stack.start_relay_for_a_users_crash(&[]);
    let first = stack
        .student_client()
        .create_student(create(2))
        .await
        .expect("the outbox flow answers without waiting for Users")
        .into_inner();
    stack.wait_for_users_abort();
    stack.restart_users(None).await;
    let again = stack
        .student_client()
        .create_student(create(2))
        .await
        .expect("the retry returns the same student")
        .into_inner();
    assert_eq!(again.id, first.id);
    stack.wait_until_all_linked(1).await;
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 1));
    // Users: the orphan of the direct flow, and student 2's user, created once.
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (2, 3));
    // `relay audit` names the orphan: a user of a student the Student DB never saved.
    let first_id: uuid::Uuid = first.id.parse().expect("uuid");
    let orphan = users_svc::entity::users::Entity::find()
        .filter(users_svc::entity::users::Column::StudentId.ne(first_id))
        .one(&stack.users_db)
        .await
        .expect("users")
        .expect("the orphan");
    let audit = stack.relay_command(&["audit"]);
    assert_eq!(
        (audit.status.code(), String::from_utf8_lossy(&audit.stdout)),
        (
            Some(1),
            format!(
                "user {}: Users holds it, enabled, for student {}, which the Student DB does \
                 not have\nchecked=1 problems=1\n",
                orphan.id, orphan.student_id
            )
            .into()
        )
    );
}

/// PostgreSQL only (`--wake-relays` chooses how student-svc `NOTIFY`s; SQLite has no
/// `NOTIFY`, and its relays watch the file whatever the flag says). README ("Wake-up";
/// metric `relay_wakeups_total`): with student-svc at `--wake-relays off` nothing
/// `NOTIFY`s, so three students are linked by the relay's poll alone and its count of
/// wake-ups stays 0; back at the default, the next student's commit wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wake_ups_off_no_commit_wakes_a_relay() {
    let Some(mut stack) = Stack::start_with_metrics(Backend::Postgres).await else {
        return;
    };
    let relay_metrics = stack.metrics_addr("relay-0").await;
    let wakeups = || async { gauge(&scrape(relay_metrics).await, "relay_wakeups_total") };
    // The relay listens first, so a NOTIFY sent would be heard.
    eventually("the relay LISTENing", LINK_DEADLINE, || async {
        let text = scrape(relay_metrics).await;
        (sample(&text, "relay_wakeups_listening", &[]) == 1.0).then_some(())
    })
    .await;
    stack
        .restart_student_with(None, &["--wake-relays", "off"])
        .await;
    stack.create_students(0..3).await;
    stack.wait_until_all_linked(3).await;
    assert_eq!(wakeups().await, 0.0, "a commit woke the relay");
    stack.restart_student(None).await;
    stack.create_students(3..4).await;
    stack.wait_until_all_linked(4).await;
    eventually("a commit to wake the relay", LINK_DEADLINE, || async {
        (wakeups().await >= 1.0).then_some(())
    })
    .await;
}

/// README ("Limits"): student-svc too sheds what exceeds its `--max-concurrent-requests`
/// at once, storing nothing of it. With a limit of 1 and the first commit held 3 s (a
/// `sleep` fail point), two CreateStudents sent together: one is created, the other is
/// `RESOURCE_EXHAUSTED` (`OVERLOADED`) and writes nothing.
async fn student_svc_sheds_what_exceeds_its_max_concurrent_requests(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let slow_commit = format!("{}=1*sleep(3000)", points::STUDENT_BEFORE_COMMIT);
    stack
        .restart_student_with(Some(&slow_commit), &["--max-concurrent-requests", "1"])
        .await;
    let send = |n: usize| {
        let mut client = stack.student_client();
        async move {
            client
                .create_student(crate::support::student_request(n))
                .await
        }
    };
    let (first, second) = tokio::join!(send(1), send(2));
    let (created, shed) = match (first, second) {
        (Ok(created), Err(shed)) | (Err(shed), Ok(created)) => (created.into_inner(), shed),
        answers => panic!("one created and one shed, not {answers:?}"),
    };
    assert_eq!(
        (shed.code(), platform::status::reason(&shed).as_deref()),
        (tonic::Code::ResourceExhausted, Some("OVERLOADED")),
        "{shed:?}"
    );
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 1));
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    assert_eq!(created.version, 1);
}

/// Users sheds what exceeds its `--max-concurrent-requests` (RESOURCE_EXHAUSTED, the call
/// not judged). A relay sending far more at once sends fewer (it claims no more rows than
/// its lowered limit lets it send), and sends each shed call again after the wait Users
/// asks for, inside the row's lease: no write, no attempt used. With only two attempts
/// allowed, every student is still linked at its first attempt.
async fn calls_users_sheds_cost_no_attempt_and_the_relay_sends_fewer(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Two calls at most, each held 50 ms: a relay sending 64 rows two to a call overruns
    // it at once, and 200 rows keep it busy for seconds.
    const BACKLOG: usize = 200;
    stack
        .restart_users_with(
            Some("users-on-request=sleep(50)"),
            &["--max-concurrent-requests", "2"],
        )
        .await;
    stack.create_students(0..BACKLOG).await;
    // A lease of 15 s (the default; the tests' own is 2 s) leaves time for every wait.
    stack.start_relay(
        None,
        &[
            "--concurrency",
            "64",
            "--rows-per-call",
            "2",
            "--max-attempts",
            "2",
            "--lease",
            "15s",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let relay_metrics = stack.metrics_addr("relay-1").await;
    let in_flight_limit =
        || async move { sample(&scrape(relay_metrics).await, "relay_in_flight_limit", &[]) };
    stack
        .wait_for_relay_log_lines("Users is shedding calls; sending fewer at once", 1)
        .await;
    // Once the rows claimed before the first shed are sent, the relay holds no more rows
    // than its lowered limit, though more wait: for three reads in a row, rows are pending
    // and at most half of --concurrency are claimed. (Claiming up to --concurrency
    // whatever the limit, it would hold about 64 until the backlog is gone.)
    let streak = std::cell::Cell::new(0);
    eventually(
        "fewer rows claimed while more wait",
        LINK_DEADLINE,
        || async {
            let rows = stack.outbox_rows().await;
            let count = |status| rows.iter().filter(|row| row.status == status).count();
            let fewer = count(OutboxStatus::Pending) > 0 && count(OutboxStatus::Processing) <= 32;
            streak.set(if fewer { streak.get() + 1 } else { 0 });
            (streak.get() == 3).then_some(())
        },
    )
    .await;
    stack.wait_until_all_linked(BACKLOG as u64).await;
    assert_linked_at_first_attempt(&stack.outbox_rows().await);
    let log = stack.relay_log();
    assert!(
        log.contains("Users is shedding calls; sending fewer at once"),
        "the relay saw calls shed"
    );
    // The lease covered every wait: no row went back to the table.
    assert!(!log.contains(GIVEN_BACK), "{log}");
    let lowered = in_flight_limit().await;
    assert!(lowered < 64.0, "the relay sends fewer: {lowered}");

    // Users' limit lifted: as calls are answered, the relay sends more again.
    stack.restart_users(None).await;
    let mut created = BACKLOG;
    eventually("the relay's limit to grow back", LINK_DEADLINE, || {
        let more = created..created + 20;
        created += 20;
        let stack = &stack;
        async move {
            stack.create_students(more).await;
            (in_flight_limit().await > lowered).then_some(())
        }
    })
    .await;
    stack.wait_until_all_linked(created as u64).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, created).await;
    stack.assert_audit_clean(created);
}

/// What the relay logs when a shed call's row goes back to the table with its attempt.
const GIVEN_BACK: &str = "the row goes back with its attempt";

/// The same overload with a lease too short to wait in: one call (of two rows) at a time,
/// 800 ms each, against rows that must be sent within a second of their claim. Most shed
/// rows go back to the table with their attempt handed back, and are claimed again later:
/// still each linked at its first attempt. (The times are twice what the shape needs, so
/// an accepted call stays within its timeout when a loaded machine stalls a commit.)
async fn a_shed_row_the_lease_cannot_wait_for_goes_back_with_its_attempt(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack
        .restart_users_with(
            Some("users-on-request=sleep(800)"),
            &["--max-concurrent-requests", "1"],
        )
        .await;
    stack.create_students(0..8).await;
    // Lease 3 s = call timeout 2 s + the least margin (half the call timeout): a row shed
    // after the first second of its lease cannot be sent again within it.
    stack.start_relay(
        None,
        &[
            "--concurrency",
            "8",
            "--rows-per-call",
            "2",
            "--max-attempts",
            "2",
            "--call-timeout",
            "2s",
            "--lease",
            "3s",
        ],
    );
    stack.wait_until_all_linked(8).await;
    assert_linked_at_first_attempt(&stack.outbox_rows().await);
    let log = stack.relay_log();
    assert!(log.contains(GIVEN_BACK), "{log}");
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 8).await;
    stack.assert_audit_clean(8);
}
