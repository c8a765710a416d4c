//! The naive flow, kept as a baseline and as the anti-pattern this project exists to
//! replace: `--link-mode direct` makes CreateStudent call Users itself, with a fresh key,
//! and save the student only if and when Users answers.
//!
//! Two local transactions that no commit joins: if Users commits and its answer is lost
//! (a timeout, a crash), the client's retry sends a *new* key, so Users sees a new
//! operation; it rejects it (the lost user holds the document number: the student can
//! never be created, the user is an orphan) or, if that user was disabled, creates a
//! second one. `processes::direct_mode_loses_the_student_where_the_outbox_does_not` shows
//! it. Never the default; BENCHMARKS.md compares the two.

use std::time::Duration;

use anyhow::Context as _;
use platform::{otlp::ExportedSpan, trace::TraceContext};
use proto::users::v1::{CreateUserRequest, users_service_client::UsersServiceClient};
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};
use uuid::Uuid;

use crate::new_student::NewStudent;

/// How CreateStudent gets its login user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LinkMode {
    /// The student and a `create-user` outbox row in one transaction; the relay delivers it
    /// (the design of this project).
    #[default]
    Outbox,
    /// Call Users synchronously with a fresh key, then save the student (the naive flow:
    /// a baseline for benchmarks, and the anti-pattern).
    Direct,
}

/// A Users client for the direct flow.
#[derive(Clone)]
pub struct DirectUsers {
    client: UsersServiceClient<Channel>,
    timeout: Duration,
    authorization: Option<MetadataValue<Ascii>>,
}

impl DirectUsers {
    /// Prepares a client of `url` (`https://` with `ca_pem`, or the system's roots), sending
    /// `token` if given; it connects on first use.
    pub fn new(
        url: &str,
        ca_pem: Option<Vec<u8>>,
        token: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("invalid Users URL {url}"))?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            let tls = match ca_pem {
                Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .context("invalid TLS settings for Users")?;
        }
        let authorization = token
            .map(|token| MetadataValue::try_from(format!("Bearer {token}")))
            .transpose()
            .context("the Users token must be printable ASCII")?;
        Ok(Self {
            client: UsersServiceClient::new(endpoint.connect_lazy()),
            timeout,
            authorization,
        })
    }

    /// Creates the user for `new`, to be the student `student_id`, under a fresh key: the
    /// flaw. Returns the user id.
    pub async fn create_user(
        &self,
        new: &NewStudent,
        student_id: Uuid,
        trace: TraceContext,
    ) -> Result<Uuid, Status> {
        let mut request = Request::new(CreateUserRequest {
            idempotency_key: Uuid::new_v4().to_string(),
            email: new.email.clone(),
            first_name: new.first_name.clone(),
            last_name: new.last_name.clone(),
            document_number: new.document_number.clone(),
            student_id: student_id.to_string(),
        });
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        let call = trace.child();
        call.inject(request.metadata_mut());
        request.set_timeout(self.timeout);
        let span = ExportedSpan::client_of_this_call(call, "users.v1.UsersService", "CreateUser");
        let response = span.ended(self.client.clone().create_user(request).await)?;
        Uuid::try_parse(&response.into_inner().user_id)
            .map_err(|_| Status::internal("Users returned a malformed user_id"))
    }
}
