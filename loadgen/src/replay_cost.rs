//! What answering a repeat from the inbox costs next to executing a CreateUser: the same
//! requests, one at a time, first fresh, then again with `idempotency-replay-only`; and,
//! for scale, the floor under both: a gRPC call on the same channel with no database
//! behind it (the health service's `Check`).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use proto::users::v1::{CreateUserRequest, users_service_client::UsersServiceClient};
use serde::{Deserialize, Serialize};
use tonic::{
    Request,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{
    stats::{Latency, ratio},
    system::{Backend, Options, System},
};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayCost {
    pub fresh: Latency,
    pub replay: Latency,
    /// `grpc.health.v1.Health/Check` on the same channel: a call that reads no database.
    pub call_floor: Latency,
    /// Replay p50 ÷ fresh p50.
    pub ratio: f64,
}

pub async fn measure(
    backend: &Backend,
    env: &[(String, String)],
    calls: usize,
) -> anyhow::Result<ReplayCost> {
    let options = Options {
        relays: 0,
        link_mode: "outbox".into(),
        env: env.to_vec(),
    };
    let system = System::start(backend, &options).await?;
    let result = async {
        let users = system
            .running
            .users
            .as_ref()
            .context("replay-cost calls users-svc: give --users-url with --student-url")?;
        let channel = users
            .connect()
            .await
            .with_context(|| format!("connect to users-svc at {}", users.uri()))?;
        let client = UsersServiceClient::new(channel.clone());
        // Unique per run: a running system may have seen an earlier run's keys.
        let run = crate::rows::new_run_id();
        let requests: Vec<CreateUserRequest> = (0..calls)
            .map(|n| CreateUserRequest {
                idempotency_key: format!("replay-cost-{run}-{n}"),
                email: format!("replay.{run}.{n}@example.edu"),
                first_name: "Replay".into(),
                last_name: "Cost".into(),
                document_number: format!("R{run}-{n}"),
                student_id: uuid::Uuid::now_v7().to_string(),
            })
            .collect();
        let health = HealthClient::new(channel);
        // A running users-svc may ask for a token (`--users-auth-token`).
        let token = system.running.users_authorization.as_ref();
        let fresh = time_calls(&client, &requests, token, false).await?;
        let replay = time_calls(&client, &requests, token, true).await?;
        let call_floor = time_health_checks(&health, calls).await?;
        anyhow::Ok(ReplayCost {
            ratio: ratio(replay.p50_ms, fresh.p50_ms),
            fresh,
            replay,
            call_floor,
        })
    }
    .await;
    system.stop().await;
    result
}

async fn time_calls(
    client: &UsersServiceClient<Channel>,
    requests: &[CreateUserRequest],
    token: Option<&MetadataValue<Ascii>>,
    replay_only: bool,
) -> anyhow::Result<Latency> {
    let mut times: Vec<Duration> = Vec::with_capacity(requests.len());
    for request in requests {
        let mut request = Request::new(request.clone());
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        if replay_only {
            request.metadata_mut().insert(
                "idempotency-replay-only",
                MetadataValue::from_static("true"),
            );
        }
        let started = Instant::now();
        client.clone().create_user(request).await?;
        times.push(started.elapsed());
    }
    Ok(Latency::of(times))
}

async fn time_health_checks(
    client: &HealthClient<Channel>,
    calls: usize,
) -> anyhow::Result<Latency> {
    let mut times: Vec<Duration> = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        client.clone().check(HealthCheckRequest::default()).await?;
        times.push(started.elapsed());
    }
    Ok(Latency::of(times))
}
