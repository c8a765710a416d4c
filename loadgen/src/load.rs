//! Driving CreateStudent: a closed loop (N calls, C in flight) or an open loop (a fixed
//! rate for a while, whatever the answers take).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::StreamExt as _;
use proto::student::v1::{CreateStudentRequest, student_service_client::StudentServiceClient};
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

use crate::stats::Latency;

/// What a series of CreateStudent calls gave.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Calls {
    pub calls: usize,
    pub errors: usize,
    pub seconds: f64,
    pub per_second: f64,
    pub latency: Latency,
}

/// A client of the student-svc at `endpoint`.
pub async fn client(endpoint: &Endpoint) -> anyhow::Result<StudentServiceClient<Channel>> {
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connect to student-svc at {}", endpoint.uri()))?;
    Ok(StudentServiceClient::new(channel))
}

/// A CreateStudent distinct within `run` for each `n`.
fn request(run: &str, n: usize) -> CreateStudentRequest {
    CreateStudentRequest {
        first_name: "Load".into(),
        last_name: format!("Student{n}"),
        email: format!("load.{run}.{n}@example.edu"),
        document_number: format!("L{run}-{n}"),
        idempotency_key: Some(format!("{}{n}", key_prefix(run))),
    }
}

/// What every CreateStudent key of `run` starts with; the key is on the student and on its
/// outbox row, so a run's rows are found among anybody else's.
pub fn key_prefix(run: &str) -> String {
    format!("load-{run}-")
}

/// Sends `count` CreateStudents with `in_flight` at a time.
pub async fn closed_loop(
    client: &StudentServiceClient<Channel>,
    run: &str,
    count: usize,
    in_flight: usize,
) -> Calls {
    let done = Arc::new(AtomicUsize::new(0));
    let progress = progress_printer("created", done.clone(), count);
    let started = Instant::now();
    let results: Vec<Result<Duration, tonic::Status>> = futures::stream::iter(0..count)
        .map(|n| {
            let (mut client, done) = (client.clone(), done.clone());
            let request = request(run, n);
            async move {
                let sent = Instant::now();
                let answer = client.create_student(request).await.map(|_| sent.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
                answer
            }
        })
        .buffer_unordered(in_flight.max(1))
        .collect()
        .await;
    progress.abort();
    summarise(results, started.elapsed())
}

/// Sends CreateStudents at `rate` per second for `duration`, each on its own task, so a
/// slow answer never delays the next call (the latency an arrival rate really sees).
pub async fn open_loop(
    client: &StudentServiceClient<Channel>,
    run: &str,
    rate: f64,
    duration: Duration,
) -> Calls {
    let count = (rate * duration.as_secs_f64()).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let done = Arc::new(AtomicUsize::new(0));
    let progress = progress_printer("created", done.clone(), count);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for n in 0..count {
        tokio::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
        let (mut client, done) = (client.clone(), done.clone());
        let request = request(run, n);
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let answer = client.create_student(request).await.map(|_| sent.elapsed());
            done.fetch_add(1, Ordering::Relaxed);
            answer
        }));
    }
    let mut results = Vec::with_capacity(count);
    for task in tasks {
        results.push(
            task.await
                .unwrap_or_else(|err| Err(tonic::Status::internal(err.to_string()))),
        );
    }
    progress.abort();
    summarise(results, started.elapsed())
}

fn summarise(results: Vec<Result<Duration, tonic::Status>>, elapsed: Duration) -> Calls {
    let calls = results.len();
    let mut errors = 0;
    let mut latencies = Vec::with_capacity(calls);
    for result in results {
        match result {
            Ok(latency) => latencies.push(latency),
            Err(status) => {
                if errors == 0 {
                    eprintln!("  first error: {status:?}");
                }
                errors += 1;
            }
        }
    }
    let seconds = elapsed.as_secs_f64();
    Calls {
        calls,
        errors,
        seconds,
        per_second: crate::stats::ratio((calls - errors) as f64, seconds),
        latency: Latency::of(latencies),
    }
}

/// Prints `what done/total` to stderr every two seconds until aborted.
pub fn progress_printer(
    what: &'static str,
    done: Arc<AtomicUsize>,
    total: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            eprintln!("  … {what} {}/{total}", done.load(Ordering::Relaxed));
        }
    })
}
