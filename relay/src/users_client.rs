//! The relay's side of `users.v1.UsersService/CreateUser`.

use std::time::Duration;

use anyhow::Context as _;
use proto::users::v1::{CreateUserRequest, users_service_client::UsersServiceClient};
use student_svc::entity::outbox::CreateUserPayload;
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    transport::{Channel, Endpoint},
};

/// Response header Users sets when it answered from its inbox.
const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Request metadata asking Users to answer from its inbox only, never to create.
const REPLAY_ONLY_HEADER: &str = "idempotency-replay-only";

/// A client of the Users service with a deadline on every call.
#[derive(Clone)]
pub struct UsersClient {
    inner: UsersServiceClient<Channel>,
    call_timeout: Duration,
}

/// What Users answered to a CreateUser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedUser {
    pub user_id: String,
    /// True when Users answered from its inbox (`idempotent-replayed: true`).
    pub from_inbox: bool,
}

impl UsersClient {
    /// Prepares a client for `url`. It connects on first use, so the relay can start before
    /// Users, and reconnects by itself after Users restarts.
    pub fn new(url: &str, call_timeout: Duration) -> anyhow::Result<Self> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("invalid Users URL {url}"))?
            .connect_timeout(call_timeout)
            .tcp_nodelay(true);
        Ok(Self {
            inner: UsersServiceClient::new(endpoint.connect_lazy()),
            call_timeout,
        })
    }

    /// Sends `payload` under `key`. With `replay_only`, Users answers from its inbox or with
    /// NOT_FOUND, and never creates.
    pub async fn create_user(
        &self,
        key: &str,
        payload: &CreateUserPayload,
        replay_only: bool,
    ) -> Result<CreatedUser, Status> {
        let mut request = Request::new(CreateUserRequest {
            idempotency_key: key.to_owned(),
            email: payload.email.clone(),
            first_name: payload.first_name.clone(),
            last_name: payload.last_name.clone(),
            document_number: payload.document_number.clone(),
            student_id: payload.student_id.to_string(),
        });
        if replay_only {
            request
                .metadata_mut()
                .insert(REPLAY_ONLY_HEADER, MetadataValue::from_static("true"));
        }
        // The deadline travels with the call (grpc-timeout), so Users stops working on an
        // answer nobody waits for, and bounds the wait here.
        request.set_timeout(self.call_timeout);
        let mut client = self.inner.clone();
        let call = client.create_user(request);
        let response = tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "Users did not answer within {:?}",
                    self.call_timeout
                ))
            })??;
        let from_inbox = response
            .metadata()
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value == "true");
        Ok(CreatedUser {
            user_id: response.into_inner().user_id,
            from_inbox,
        })
    }
}
