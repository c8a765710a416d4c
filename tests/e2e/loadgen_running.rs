//! `loadgen` against a system it did not start (`--student-url`): it drives the running
//! student-svc, counts only its own rows among anybody else's, knows none of the system's
//! processes, and stops nothing.

use clap::Parser as _;

use crate::{
    on_both_backends,
    support::{
        Backend,
        app::{AppOptions, spawn_app_with},
        certs::TestPki,
        invariants::students_and_outbox_rows,
        stack::Stack,
        student_request,
    },
};

on_both_backends!(
    loadgen_measures_a_running_system_and_counts_only_its_own_rows,
    loadgen_measures_a_running_system_over_tls,
);

async fn loadgen_measures_a_running_system_and_counts_only_its_own_rows(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let cli = loadgen::suite::Cli::try_parse_from([
        "loadgen",
        "--student-url",
        &format!("http://{}", stack.student_addr),
        "--student-database-url",
        &stack.dbs.student_url,
        "closed",
        "--students",
        "40",
        "--in-flight",
        "4",
    ])
    .expect("loadgen's command line");
    // Somebody else's students, created while loadgen runs: their rows are written in the
    // same seconds and delivered by the same relay.
    let mut client = stack.student_client();
    let others = async {
        for n in 0..10 {
            client
                .create_student(student_request(n))
                .await
                .expect("another client's CreateStudent");
        }
    };
    let (report, ()) = tokio::join!(loadgen::suite::execute(&cli), others);
    let report = report.expect("loadgen measures the running system");

    let closed = &report["results"]["closed"];
    assert_eq!(report["backend"], "running", "{report:#}");
    assert_eq!(closed["create"]["calls"], 40, "{report:#}");
    assert_eq!(closed["create"]["errors"], 0, "{report:#}");
    assert_eq!(closed["links"]["rows"], 40, "only its own rows: {report:#}");
    assert_eq!(closed["processes"], serde_json::json!([]), "{report:#}");

    // It stopped nothing and dropped nothing: the system goes on serving and linking.
    stack.create_students(10..11).await;
    stack.wait_until_all_linked(51).await;
}

/// A system served over TLS, its Users asking for a token: loadgen reaches it at
/// `https://` URLs, checking the services' certificates against `--tls-ca`, and measures
/// CreateStudent and (with `--users-auth-token`) the replay cost as in plaintext. Without
/// the CA it trusts only the system's roots: the run stops at the first connection,
/// naming the service, having sent nothing; with another token Users refuses the calls.
async fn loadgen_measures_a_running_system_over_tls(backend: Backend) {
    const TOKEN: &str = "loadgen-token-0123456789";
    let pki = TestPki::new();
    let options = AppOptions {
        tls: Some(pki.clone()),
        users_token: Some(TOKEN.to_owned()),
        ..AppOptions::default()
    };
    let Some(app) = spawn_app_with(backend, options).await else {
        return;
    };
    let (ca, _, _) = pki.write_to(app.databases.dir.path());
    let student_url = format!("https://{}", app.student_addr);
    let users_url = format!("https://{}", app.users_addr);
    let loadgen = |tls_ca: Option<&std::path::Path>, mode: &[&str]| {
        let mut args: Vec<String> = [
            "loadgen",
            "--student-url",
            &student_url,
            "--student-database-url",
            &app.databases.student_url,
            "--users-url",
            &users_url,
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(ca) = tls_ca {
            args.extend(["--tls-ca".to_owned(), ca.display().to_string()]);
        }
        args.extend(mode.iter().map(|arg| (*arg).to_owned()));
        loadgen::suite::Cli::try_parse_from(args).expect("loadgen's command line")
    };

    let closed = [
        "closed",
        "--students",
        "20",
        "--in-flight",
        "2",
        "--relays",
        "0",
    ];
    let report = loadgen::suite::execute(&loadgen(Some(&ca), &closed))
        .await
        .expect("loadgen measures the system over TLS");
    let create = &report["results"]["closed"]["create"];
    assert_eq!(
        (&create["calls"], &create["errors"]),
        (&20.into(), &0.into())
    );
    let replay_cost = ["replay-cost", "--calls", "5", "--users-auth-token", TOKEN];
    let report = loadgen::suite::execute(&loadgen(Some(&ca), &replay_cost))
        .await
        .expect("loadgen calls users-svc over TLS, with the token");
    let cost = &report["results"]["replay_cost"];
    assert_eq!(
        (&cost["fresh"]["count"], &cost["replay"]["count"]),
        (&5.into(), &5.into()),
        "{report:#}"
    );

    let refused = loadgen::suite::execute(&loadgen(None, &closed))
        .await
        .expect_err("a certificate from a CA loadgen does not trust");
    assert!(
        format!("{refused:#}").contains(&format!("connect to student-svc at {student_url}")),
        "{refused:#}"
    );
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (20, 20));
    let wrong_token = [
        "replay-cost",
        "--users-auth-token",
        "not-the-token-0123456789",
    ];
    let unauthenticated = loadgen::suite::execute(&loadgen(Some(&ca), &wrong_token))
        .await
        .expect_err("Users asks for its token");
    let status = unauthenticated
        .downcast_ref::<tonic::Status>()
        .expect("Users' answer");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
}
