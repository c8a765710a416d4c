//! `loadgen` against a system it did not start (`--student-url`): it drives the running
//! student-svc, counts only its own rows among anybody else's, knows none of the system's
//! processes, and stops nothing.

use clap::Parser as _;

use crate::{
    on_both_backends,
    support::{Backend, stack::Stack, student_request},
};

on_both_backends!(loadgen_measures_a_running_system_and_counts_only_its_own_rows);

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
