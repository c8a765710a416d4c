//! `loadgen`: drives a running system (see BENCHMARKS.md). It creates students with a fixed
//! number of calls in flight, reports CreateStudent throughput and latency, then polls
//! ListStudents until every one of them is linked and reports how long delivery took.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clap::Parser;
use futures::StreamExt as _;
use proto::student::v1::{
    CreateStudentRequest, ListStudentsRequest, UserLinkStatus,
    student_service_client::StudentServiceClient,
};
use tonic::transport::Channel;

#[derive(Parser)]
#[command(about = "Load generator: CreateStudent throughput and end-to-end link time")]
struct Args {
    /// student-svc address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    student_url: String,
    /// Students to create.
    #[arg(long, default_value_t = 2000)]
    students: usize,
    /// CreateStudent calls in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Give up waiting for links after this many seconds.
    #[arg(long, default_value_t = 300)]
    link_timeout_secs: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let channel = Channel::from_shared(args.student_url.clone())?
        .connect()
        .await
        .context("connect to student-svc")?;
    let client = StudentServiceClient::new(channel);
    // Unique per run, so runs against one database never collide on document numbers.
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();

    let started = Instant::now();
    let mut latencies: Vec<Duration> = futures::stream::iter(0..args.students)
        .map(|n| {
            let (mut client, run) = (client.clone(), run.clone());
            async move {
                let sent = Instant::now();
                client
                    .create_student(CreateStudentRequest {
                        first_name: "Load".into(),
                        last_name: format!("Student{n}"),
                        email: format!("load.{run}.{n}@example.edu"),
                        document_number: format!("L{run}-{n}"),
                        idempotency_key: Some(format!("load-{run}-{n}")),
                    })
                    .await
                    .map(|_| sent.elapsed())
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .context("a CreateStudent failed")?;
    let created_in = started.elapsed();
    latencies.sort();
    let percentile = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "create: {} students in {:.2} s = {:.0} CreateStudent/s (concurrency {}), latency p50 {:.1} ms, p99 {:.1} ms",
        args.students,
        created_in.as_secs_f64(),
        args.students as f64 / created_in.as_secs_f64(),
        args.concurrency,
        percentile(0.50).as_secs_f64() * 1e3,
        percentile(0.99).as_secs_f64() * 1e3,
    );

    let deadline = started + Duration::from_secs(args.link_timeout_secs);
    loop {
        let linked = count_linked(client.clone(), &run).await?;
        if linked == args.students {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {linked} of {} linked in time",
            args.students
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let linked_in = started.elapsed();
    println!(
        "link: all {} linked {:.2} s after the first CreateStudent = {:.0} deliveries/s end to end",
        args.students,
        linked_in.as_secs_f64(),
        args.students as f64 / linked_in.as_secs_f64(),
    );
    Ok(())
}

/// Counts this run's students that are linked, paging through ListStudents.
async fn count_linked(
    mut client: StudentServiceClient<Channel>,
    run: &str,
) -> anyhow::Result<usize> {
    let mut linked = 0;
    let mut page_token = String::new();
    loop {
        let page = client
            .list_students(ListStudentsRequest {
                page_size: 500,
                page_token,
            })
            .await?
            .into_inner();
        linked += page
            .students
            .iter()
            .filter(|s| s.document_number.starts_with(&format!("L{run}-")))
            .filter(|s| s.user_link_status() == UserLinkStatus::Linked)
            .count();
        if page.next_page_token.is_empty() {
            return Ok(linked);
        }
        page_token = page.next_page_token;
    }
}
