//! What answering a repeat from the inbox costs next to executing a CreateUser: the same
//! requests, one at a time, first fresh, then again with `idempotency-replay-only`.

use std::time::{Duration, Instant};

use proto::users::v1::{CreateUserRequest, users_service_client::UsersServiceClient};
use serde::Serialize;
use tonic::{Request, metadata::MetadataValue, transport::Channel};

use crate::{
    stats::{Latency, ratio},
    system::{Backend, Options, System},
};

#[derive(Debug, Clone, Serialize)]
pub struct ReplayCost {
    pub fresh: Latency,
    pub replay: Latency,
    /// Replay p50 ÷ fresh p50.
    pub ratio: f64,
}

pub async fn measure(backend: &Backend, calls: usize) -> anyhow::Result<ReplayCost> {
    let options = Options {
        relays: 0,
        link_mode: "outbox".into(),
        env: Vec::new(),
    };
    let system = System::start(backend, &options).await?;
    let result = async {
        let channel = Channel::from_shared(format!("http://{}", system.users_addr))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        let client = UsersServiceClient::new(channel);
        let requests: Vec<CreateUserRequest> = (0..calls)
            .map(|n| CreateUserRequest {
                idempotency_key: format!("replay-cost-{n}"),
                email: format!("replay.{n}@example.edu"),
                first_name: "Replay".into(),
                last_name: "Cost".into(),
                document_number: format!("R-{n}"),
                student_id: uuid::Uuid::now_v7().to_string(),
            })
            .collect();
        let fresh = time_calls(&client, &requests, false).await?;
        let replay = time_calls(&client, &requests, true).await?;
        anyhow::Ok(ReplayCost {
            ratio: ratio(replay.p50_ms, fresh.p50_ms),
            fresh,
            replay,
        })
    }
    .await;
    system.stop().await;
    result
}

async fn time_calls(
    client: &UsersServiceClient<Channel>,
    requests: &[CreateUserRequest],
    replay_only: bool,
) -> anyhow::Result<Latency> {
    let mut times: Vec<Duration> = Vec::with_capacity(requests.len());
    for request in requests {
        let mut request = Request::new(request.clone());
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
