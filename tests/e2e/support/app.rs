//! Both services in-process, each on its own port 0 listener, with typed clients.

use std::{net::SocketAddr, time::Duration};

use platform::grpc_server::{Limits, ServerOptions};
use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
};
use users_svc::auth::AcceptedTokens;

use super::certs::TestPki;
use proto::{
    student::v1::student_service_client::StudentServiceClient,
    users::v1::users_service_client::UsersServiceClient,
};
use relay::{Relay, RunConfig, users_client::UsersClient};
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::{Backend, TestDatabases};

/// The system minus the relay process: both services running in this test's runtime.
pub struct TestApp {
    pub student: StudentServiceClient<Channel>,
    pub users: UsersTestClient,
    pub student_addr: SocketAddr,
    pub users_addr: SocketAddr,
    pub student_db: DatabaseConnection,
    pub users_db: DatabaseConnection,
    shutdown: CancellationToken,
    // Dropped last: the databases outlive every connection to them.
    pub databases: TestDatabases,
}

/// How a test wants its services run.
#[derive(Default)]
pub struct AppOptions {
    pub limits: Limits,
    /// Serve both services over TLS with this PKI's server certificate.
    pub tls: Option<TestPki>,
    /// Require this bearer token on the Users API.
    pub users_token: Option<String>,
    /// How student-svc wakes the relays (`--wake-relays`).
    pub wake_relays: student_store::wake::WakeRelays,
    /// How long Users' inbox keeps keys (`--inbox-retention`).
    pub inbox: users_svc::InboxSettings,
    /// Run student-svc with `--link-mode direct`, calling this app's Users (plaintext
    /// only, without a token).
    pub direct_link: bool,
}

/// Starts both services on fresh databases; `None` when the backend is not configured.
pub async fn spawn_app(backend: Backend) -> Option<TestApp> {
    spawn_app_with(backend, AppOptions::default()).await
}

/// Like [`spawn_app`], with server limits of the test's choosing.
pub async fn spawn_app_with_limits(backend: Backend, limits: Limits) -> Option<TestApp> {
    spawn_app_with(
        backend,
        AppOptions {
            limits,
            ..AppOptions::default()
        },
    )
    .await
}

/// Like [`spawn_app`], with limits, TLS and a Users token of the test's choosing. Clients
/// are set up to match (trusting the PKI, sending the token).
pub async fn spawn_app_with(backend: Backend, options: AppOptions) -> Option<TestApp> {
    let dbs = TestDatabases::create(backend).await?;
    let shutdown = CancellationToken::new();

    let student_db = student_svc::open_database(&dbs.student_url, 10)
        .await
        .expect("open Student DB");
    let users_db = users_svc::open_database(&dbs.users_url, 10)
        .await
        .expect("open Users DB");

    let student_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let student_addr = student_listener.local_addr().expect("addr");
    let users_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let users_addr = users_listener.local_addr().expect("addr");
    let server = ServerOptions {
        limits: options.limits,
        tls: options.tls.as_ref().map(TestPki::identity),
    };
    let link = if options.direct_link {
        assert!(
            options.tls.is_none() && options.users_token.is_none(),
            "the direct link of this helper calls Users in plaintext, without a token"
        );
        let users = student_svc::direct::DirectUsers::new(
            &format!("http://{users_addr}"),
            None,
            None,
            Duration::from_secs(30),
        )
        .expect("direct Users client");
        student_svc::Link::Direct(Box::new(users))
    } else {
        student_svc::Link::Outbox
    };
    tokio::spawn(student_svc::run(
        student_listener,
        student_db.clone(),
        server.clone(),
        link,
        options.wake_relays,
        shutdown.clone(),
    ));
    let token = options
        .users_token
        .as_deref()
        .map(|t| AcceptedTokens::parse(t).expect("test token"));
    tokio::spawn(users_svc::run(
        users_listener,
        users_db.clone(),
        server,
        token,
        options.inbox,
        shutdown.clone(),
    ));

    Some(TestApp {
        student: StudentServiceClient::new(channel(student_addr, options.tls.as_ref())),
        users: UsersServiceClient::with_interceptor(
            channel(users_addr, options.tls.as_ref()),
            bearer(options.users_token.clone()),
        ),
        student_addr,
        users_addr,
        student_db,
        users_db,
        shutdown,
        databases: dbs,
    })
}

impl TestApp {
    /// Renames student `id` (first name `Renamed`, e-mail `renamed@example.edu`, last name
    /// as [`super::student_request`] gives it): one `update-user` row.
    pub async fn rename_student(&self, id: &str) {
        self.student
            .clone()
            .update_student(proto::student::v1::UpdateStudentRequest {
                id: id.to_owned(),
                first_name: "Renamed".into(),
                last_name: "Pérez".into(),
                email: "renamed@example.edu".into(),
                idempotency_key: None,
                expected_version: 0,
            })
            .await
            .expect("renamed");
    }

    /// A relay over this app's Student DB, delivering to this app's Users service.
    pub fn relay(&self) -> Relay {
        self.relay_to(&self.users_url())
    }

    /// A relay over this app's Student DB, delivering to `users_url`.
    pub fn relay_to(&self, users_url: &str) -> Relay {
        self.relay_with(users_url, test_tuning())
    }

    /// A relay over this app's Student DB with its own tuning.
    pub fn relay_with(&self, users_url: &str, config: RunConfig) -> Relay {
        let users = UsersClient::new(users_url, config.call_timeout).expect("users client");
        Relay::new(self.student_db.clone(), users, config)
    }

    /// A second users-svc over this app's Users DB (no TLS, no token): another replica,
    /// with its own memory of inbox answers, empty at first.
    pub async fn users_replica(&self) -> UsersTestClient {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(users_svc::run(
            listener,
            self.users_db.clone(),
            ServerOptions::default(),
            None,
            users_svc::InboxSettings::default(),
            self.shutdown.clone(),
        ));
        UsersServiceClient::with_interceptor(channel(addr, None), bearer(None))
    }

    /// The Users service's URL.
    pub fn users_url(&self) -> String {
        format!("http://{}", self.users_addr)
    }
}

/// The relay tuning of in-process tests: short deadline and lease, quick retries.
pub fn test_tuning() -> RunConfig {
    RunConfig {
        call_timeout: Duration::from_secs(2),
        lease: Duration::from_secs(5),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..RunConfig::default()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A lazily connecting channel (the server is already listening), over TLS when given a PKI.
pub fn channel(addr: SocketAddr, tls: Option<&TestPki>) -> Channel {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}")).expect("endpoint");
    if let Some(pki) = tls {
        endpoint = endpoint.tls_config(pki.client_tls()).expect("client TLS");
    }
    endpoint.connect_lazy()
}

/// A Users client as tests use it: sending the bearer token when the test has one.
pub type UsersTestClient = UsersServiceClient<InterceptedService<Channel, BearerToken>>;

/// Adds `authorization: Bearer <token>` to every call, when there is a token.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

pub fn bearer(token: Option<String>) -> BearerToken {
    BearerToken(token.map(|t| format!("Bearer {t}").parse().expect("ascii token")))
}

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
