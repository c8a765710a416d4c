//! The relay's side of `users.v1.UsersService`: one call per effect, each with the row's
//! key, a deadline, the token, and optionally `idempotency-replay-only`.

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use platform::{otlp::ExportedSpan, trace::TraceContext};
use proto::users::v1::{
    CreateUserRequest, CreateUsersItem, CreateUsersRequest, CreateUsersResult, DisableUserRequest,
    GetUserRequest, KEY_CREATED_AT_HEADER, ListUsersRequest, ListUsersResponse, REPLAY_ONLY_HEADER,
    REPLAYED_HEADER, UpdateUserRequest, User, create_users_result::Outcome,
    users_service_client::UsersServiceClient,
};
use student_store::{
    effect::{CreateUserPayload, DisableUserPayload, Effect, EffectType, UpdateUserPayload},
    entity::outbox as outbox_row,
};
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};
use uuid::Uuid;

/// A client of the Users service with a deadline on every call.
#[derive(Clone)]
pub struct UsersClient {
    inner: UsersServiceClient<Channel>,
    call_timeout: Duration,
    authorization: Option<MetadataValue<Ascii>>,
}

/// An outbox row's idempotency key as sent to Users, with when it was issued (metadata
/// How every operator command says Users did not answer a question: `cannot ask Users
/// {what}: CODE: message` (`what` as "about user U", "for student S's users").
pub fn cannot_ask(what: &str, status: &Status) -> String {
    format!(
        "cannot ask Users {what}: {}: {}",
        platform::status::code_name(status.code()),
        status.message()
    )
}

/// `idempotency-key-created-at`: Users refuses a key older than its inbox keeps keys rather
/// than risk executing it twice).
/// The call also carries the relay's hop of the row's trace (`traceparent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    pub value: &'a str,
    pub issued_at: DateTime<Utc>,
    pub trace: TraceContext,
}

impl<'a> Key<'a> {
    /// The key `row` is delivered under, within `trace` (see [`row_trace`]).
    pub fn of(row: &'a outbox_row::Model, trace: TraceContext) -> Self {
        Self {
            value: &row.idempotency_key,
            issued_at: row.key_issued_at(),
            trace,
        }
    }
}

/// The trace a row's delivery belongs to, continued from the Student call that decided the
/// row (a new one for a row stored without), and a span carrying its `trace_id`: every log
/// line about the row, retries and replays included, runs inside it.
pub fn row_trace(row: &outbox_row::Model) -> (TraceContext, tracing::Span) {
    let trace = TraceContext::continue_stored(row.traceparent.as_deref());
    let span = tracing::info_span!("outbox_row", trace_id = %trace.trace_id(), outbox_id = row.id);
    (trace, span)
}

/// The Users method a row of `effect_type` calls.
fn users_method(effect_type: &str) -> &'static str {
    match EffectType::parse(effect_type) {
        Some(EffectType::CreateUser) => "CreateUser",
        Some(EffectType::UpdateUser) => "UpdateUser",
        Some(EffectType::DisableUser) => "DisableUser",
        None => "unknown",
    }
}

/// The row's delivery as a span of its trace, exported when a collector is named: the
/// parent of Users' span for the call, named after the method the row's effect calls.
pub fn delivery_span(row: &outbox_row::Model, trace: TraceContext) -> ExportedSpan {
    let mut span = ExportedSpan::client(
        trace,
        "users.v1.UsersService",
        users_method(&row.effect_type),
    );
    span.set("outbox.id", row.id);
    span
}

/// What Users answered to an effect's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The user the effect created or changed.
    pub user_id: Uuid,
    /// False when an update or disable was not applied: the user already reflected that
    /// version of its student or a newer one. Always true for a creation.
    pub applied: bool,
    /// True when Users answered from its inbox (`idempotent-replayed: true`).
    pub from_inbox: bool,
}

/// Where Users is and how to reach it.
#[derive(Clone, Default)]
pub struct UsersConnection {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub url: String,
    /// PEM CA certificate(s) to trust for `https://`; the system's roots when `None`.
    pub ca_pem: Option<Vec<u8>>,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub auth_token: Option<String>,
}

impl UsersConnection {
    /// Plaintext, no token.
    pub fn plain(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            ..Self::default()
        }
    }
}

impl std::fmt::Debug for UsersConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsersConnection")
            .field("url", &self.url)
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "…"))
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl UsersClient {
    /// Prepares a plaintext client for `url`, with no token.
    pub fn new(url: &str, call_timeout: Duration) -> anyhow::Result<Self> {
        Self::connect(&UsersConnection::plain(url), call_timeout)
    }

    /// Prepares a client. It connects on first use, so the relay can start before Users,
    /// and reconnects by itself after Users restarts.
    pub fn connect(connection: &UsersConnection, call_timeout: Duration) -> anyhow::Result<Self> {
        let url = &connection.url;
        let mut endpoint = Endpoint::from_shared(url.clone())
            .with_context(|| format!("invalid Users URL {url}"))?
            .connect_timeout(call_timeout)
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            let tls = match &connection.ca_pem {
                Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .context("invalid TLS settings for Users")?;
        } else {
            anyhow::ensure!(
                connection.ca_pem.is_none(),
                "a Users CA was given but USERS_URL is not https://"
            );
        }
        let authorization = connection
            .auth_token
            .as_deref()
            .map(|token| MetadataValue::try_from(format!("Bearer {token}")))
            .transpose()
            .context("the Users token must be printable ASCII")?;
        Ok(Self {
            inner: UsersServiceClient::new(endpoint.connect_lazy()),
            call_timeout,
            authorization,
        })
    }

    /// Sends `payload` under `key`. With `replay_only`, Users answers from its inbox or with
    /// NOT_FOUND, and never creates.
    pub async fn create_user(
        &self,
        key: Key<'_>,
        payload: &CreateUserPayload,
        replay_only: bool,
    ) -> Result<Answer, Status> {
        let request = Request::new(create_request(&key, payload));
        let response = self
            .send(
                request,
                Some(key),
                replay_only,
                |mut client, request| async move { client.create_user(request).await },
            )
            .await?;
        let from_inbox = was_replayed_response(response.metadata());
        Ok(Answer {
            user_id: parse_user_id(&response.into_inner().user_id)?,
            applied: true,
            from_inbox,
        })
    }

    /// Sends many `create-user` effects in one CreateUsers call, each under its own key and
    /// in its own trace. Returns one answer per item, in order, each what
    /// [`UsersClient::create_user`] would have returned for it alone; the call's own failure
    /// (Users down, shedding, a deadline) is every item's.
    pub async fn create_users(
        &self,
        items: &[(Key<'_>, &CreateUserPayload)],
    ) -> Result<Vec<Result<Answer, Status>>, Status> {
        let request = Request::new(CreateUsersRequest {
            items: items
                .iter()
                .map(|(key, payload)| CreateUsersItem {
                    user: Some(create_request(key, payload)),
                    key_created_at: Some(platform::timestamp::to_proto(key.issued_at)),
                    traceparent: key.trace.to_string(),
                })
                .collect(),
        });
        let response = self
            .send(request, None, false, |mut client, request| async move {
                client.create_users(request).await
            })
            .await?;
        let results = response.into_inner().results;
        if results.len() != items.len() {
            return Err(Status::internal(format!(
                "Users answered {} results to {} items",
                results.len(),
                items.len()
            )));
        }
        Ok(results.into_iter().map(item_answer).collect())
    }

    /// Reads user `id` (GetUser); `None` when Users has no such user.
    pub async fn get_user(&self, id: Uuid) -> Result<Option<User>, Status> {
        let request = Request::new(GetUserRequest { id: id.to_string() });
        match self
            .send(request, None, false, |mut client, request| async move {
                client.get_user(request).await
            })
            .await
        {
            Ok(response) => Ok(Some(response.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Every user Users holds for `student_id` (ListUsers), oldest first. A Users older
    /// than this relay has no ListUsers: its UNIMPLEMENTED says so, and what to do.
    pub async fn list_users(&self, student_id: Uuid) -> Result<Vec<User>, Status> {
        let request = ListUsersRequest {
            student_id: student_id.to_string(),
            ..ListUsersRequest::default()
        };
        Ok(self.list(request).await?.users)
    }

    /// One page of every user Users holds, in id order, after the page whose
    /// `next_page_token` is `page_token` (empty: the first): the users, and the token of
    /// the next page (empty: the last). A Users that cannot list every user (older than
    /// this relay: it asks for a student) is named, with what to do.
    pub async fn users_page(
        &self,
        page_token: String,
        page_size: i32,
    ) -> Result<(Vec<User>, String), Status> {
        let request = ListUsersRequest {
            student_id: String::new(),
            page_size,
            page_token,
        };
        let page = self.list(request).await.map_err(|status| {
            let asks_for_a_student = status.code() == tonic::Code::InvalidArgument
                && platform::status::invalid_field(&status).as_deref() == Some("student_id");
            if asks_for_a_student {
                Status::unimplemented(
                    "Users cannot list every user: it is older than this relay; upgrade \
                     users-svc first",
                )
            } else {
                status
            }
        })?;
        Ok((page.users, page.next_page_token))
    }

    async fn list(&self, request: ListUsersRequest) -> Result<ListUsersResponse, Status> {
        let response = self
            .send(
                Request::new(request),
                None,
                false,
                |mut client, request| async move { client.list_users(request).await },
            )
            .await
            .map_err(|status| match status.code() {
                tonic::Code::Unimplemented => Status::unimplemented(
                    "Users has no ListUsers: it is older than this relay; upgrade users-svc first",
                ),
                _ => status,
            })?;
        Ok(response.into_inner())
    }

    /// Sends an `update-user` effect under `key` to `user` (see [`UsersClient::deliver`])
    /// (replay-only: answered from the inbox or NOT_FOUND, never executed).
    pub async fn update_user(
        &self,
        key: Key<'_>,
        payload: &UpdateUserPayload,
        user: Option<Uuid>,
        replay_only: bool,
    ) -> Result<Answer, Status> {
        let request = Request::new(UpdateUserRequest {
            idempotency_key: key.value.to_owned(),
            student_id: payload.student_id.to_string(),
            first_name: payload.first_name.clone(),
            last_name: payload.last_name.clone(),
            email: payload.email.clone(),
            source_version: payload.source_version,
            user_id: named(user),
        });
        let response = self
            .send(
                request,
                Some(key),
                replay_only,
                |mut client, request| async move { client.update_user(request).await },
            )
            .await?;
        let from_inbox = was_replayed_response(response.metadata());
        let reply = response.into_inner();
        Ok(Answer {
            user_id: parse_user_id(&reply.user_id)?,
            applied: reply.applied,
            from_inbox,
        })
    }

    /// Sends a `disable-user` effect under `key` to `user` (replay-only as for
    /// [`UsersClient::update_user`]).
    pub async fn disable_user(
        &self,
        key: Key<'_>,
        payload: &DisableUserPayload,
        user: Option<Uuid>,
        replay_only: bool,
    ) -> Result<Answer, Status> {
        let request = Request::new(DisableUserRequest {
            idempotency_key: key.value.to_owned(),
            student_id: payload.student_id.to_string(),
            source_version: payload.source_version,
            user_id: named(user),
        });
        let response = self
            .send(
                request,
                Some(key),
                replay_only,
                |mut client, request| async move { client.disable_user(request).await },
            )
            .await?;
        let from_inbox = was_replayed_response(response.metadata());
        let reply = response.into_inner();
        Ok(Answer {
            user_id: parse_user_id(&reply.user_id)?,
            applied: reply.applied,
            from_inbox,
        })
    }

    /// Sends `effect` under `key`: the one place that maps an effect to its Users call. A
    /// change goes to `user`, the user its student is linked to (Users may hold several
    /// for one student); `None` leaves the choice to Users (the student's first user),
    /// which a replay-only question may do: it is answered from the inbox whatever user it
    /// names.
    pub async fn deliver(
        &self,
        key: Key<'_>,
        effect: &Effect,
        user: Option<Uuid>,
        replay_only: bool,
    ) -> Result<Answer, Status> {
        match effect {
            Effect::CreateUser(payload) => self.create_user(key, payload, replay_only).await,
            Effect::UpdateUser(payload) => self.update_user(key, payload, user, replay_only).await,
            Effect::DisableUser(payload) => {
                self.disable_user(key, payload, user, replay_only).await
            }
        }
    }

    /// Sends `request` with the token, when its key was issued, the replay-only marker if
    /// asked, and the call's deadline, which travels with it (grpc-timeout) so Users stops
    /// working on an answer nobody waits for, and bounds the wait here.
    async fn send<T, R, F, Fut>(
        &self,
        mut request: Request<T>,
        key: Option<Key<'_>>,
        replay_only: bool,
        call: F,
    ) -> Result<tonic::Response<R>, Status>
    where
        F: FnOnce(UsersServiceClient<Channel>, Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        if let Some(key) = key {
            key.trace.inject(request.metadata_mut());
            let issued_at = key
                .issued_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            // An RFC 3339 time is printable ASCII.
            if let Ok(value) = MetadataValue::try_from(issued_at) {
                request.metadata_mut().insert(KEY_CREATED_AT_HEADER, value);
            }
        }
        if replay_only {
            request
                .metadata_mut()
                .insert(REPLAY_ONLY_HEADER, MetadataValue::from_static("true"));
        }
        request.set_timeout(self.call_timeout);
        tokio::time::timeout(self.call_timeout, call(self.inner.clone(), request))
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "Users did not answer within {:?}",
                    self.call_timeout
                ))
            })?
    }
}

/// The CreateUser request of `payload` under `key`.
fn create_request(key: &Key<'_>, payload: &CreateUserPayload) -> CreateUserRequest {
    CreateUserRequest {
        idempotency_key: key.value.to_owned(),
        email: payload.email.clone(),
        first_name: payload.first_name.clone(),
        last_name: payload.last_name.clone(),
        document_number: payload.document_number.clone(),
        student_id: payload.student_id.to_string(),
    }
}

/// One CreateUsers result as the answer or status CreateUser would have given: an item's
/// error becomes the status it stands for (code, `ErrorInfo` reason, message), marked
/// `idempotent-replayed` when it is a saved answer, so it is handled exactly as CreateUser's.
fn item_answer(result: CreateUsersResult) -> Result<Answer, Status> {
    let mut status = match result.outcome {
        Some(Outcome::UserId(user_id)) => {
            return Ok(Answer {
                user_id: parse_user_id(&user_id)?,
                applied: true,
                from_inbox: result.replayed,
            });
        }
        Some(Outcome::Error(error)) => {
            let code = tonic::Code::from_i32(error.code);
            if error.reason.is_empty() {
                Status::new(code, error.message)
            } else {
                let domain = proto::users::v1::ERROR_DOMAIN;
                platform::status::with_reason(code, error.message, &error.reason, domain)
            }
        }
        None => return Err(Status::internal("Users answered an item with no outcome")),
    };
    if result.replayed {
        status
            .metadata_mut()
            .insert(REPLAYED_HEADER, MetadataValue::from_static("true"));
    }
    Err(status)
}

/// How often one call of a one-shot command may be shed before it gives up, and the wait
/// when Users does not say how long.
const MAX_SHED: u32 = 100;
const SHED_WAIT: Duration = Duration::from_millis(200);

/// `call`'s answer, for the one-shot commands (`audit`, `retry-failed`). A call Users sheds
/// (over its `--max-concurrent-requests`: not an answer) is made again after the wait Users
/// asks for, up to [`MAX_SHED`] times.
pub async fn unless_shed<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut shed = 0;
    loop {
        match call().await {
            Err(status) if status.code() == tonic::Code::ResourceExhausted && shed < MAX_SHED => {
                shed += 1;
                let wait = platform::status::retry_after(&status).unwrap_or(SHED_WAIT);
                tokio::time::sleep(wait).await;
            }
            answer => return answer,
        }
    }
}

/// `user` as a request field: empty when not named.
fn named(user: Option<Uuid>) -> String {
    user.map(|user| user.to_string()).unwrap_or_default()
}

/// A user id from Users; anything else is Users' bug, reported as INTERNAL (transient).
fn parse_user_id(user_id: &str) -> Result<Uuid, Status> {
    Uuid::try_parse(user_id).map_err(|_| Status::internal("Users returned a malformed user_id"))
}

fn was_replayed_response(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(REPLAYED_HEADER)
        .is_some_and(|value| value == "true")
}

/// Tells whether an error from Users is the saved answer of an earlier execution of the
/// key (`idempotent-replayed: true`), as opposed to a failure of this call.
pub fn was_replayed(status: &Status) -> bool {
    was_replayed_response(status.metadata())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README: a delivery's span is named after the Users method its row's effect calls.
    #[test]
    fn a_delivery_span_is_named_after_its_users_method() {
        for (effect, method) in [
            ("create-user", "CreateUser"),
            ("update-user", "UpdateUser"),
            ("disable-user", "DisableUser"),
            ("send-flowers", "unknown"),
        ] {
            assert_eq!(users_method(effect), method, "{effect}");
        }
    }

    /// The time a `grpc-timeout` value stands for (`<digits><unit>`, gRPC over HTTP/2).
    fn grpc_timeout(value: &str) -> Duration {
        let (digits, unit) = value.split_at(value.len() - 1);
        let amount: u64 = digits.parse().expect("grpc-timeout is digits then a unit");
        match unit {
            "H" => Duration::from_secs(amount * 3600),
            "M" => Duration::from_secs(amount * 60),
            "S" => Duration::from_secs(amount),
            "m" => Duration::from_millis(amount),
            "u" => Duration::from_micros(amount),
            "n" => Duration::from_nanos(amount),
            other => panic!("unknown grpc-timeout unit {other:?}"),
        }
    }

    /// A CA is only for TLS: given with a plaintext URL it is refused before any connection,
    /// rather than silently ignored.
    #[tokio::test]
    async fn a_users_ca_with_a_plaintext_url_is_refused() {
        let connection = UsersConnection {
            url: "http://127.0.0.1:1".to_owned(),
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            auth_token: None,
        };
        let err = UsersClient::connect(&connection, Duration::from_secs(5))
            .map(drop)
            .expect_err("a CA needs https://");
        assert_eq!(
            err.to_string(),
            "a Users CA was given but USERS_URL is not https://"
        );
    }

    /// Every call to Users carries its deadline (`grpc-timeout`, the call timeout), so Users
    /// stops working on an answer nobody waits for.
    #[tokio::test]
    async fn every_call_carries_the_call_timeout_as_its_grpc_timeout() {
        let call_timeout = Duration::from_secs(5);
        // Lazy: nothing listens there, and the call below never reaches the channel.
        let client = UsersClient::new("http://127.0.0.1:1", call_timeout).expect("a valid URL");
        let sent = client
            .send(Request::new(()), None, false, |_, request| async move {
                Ok(tonic::Response::new(
                    request.metadata().get("grpc-timeout").cloned(),
                ))
            })
            .await
            .expect("answered by the stand-in call")
            .into_inner()
            .expect("the request carries grpc-timeout");
        let sent = sent.to_str().expect("ascii");
        assert_eq!(grpc_timeout(sent), call_timeout, "grpc-timeout: {sent}");
    }
}
