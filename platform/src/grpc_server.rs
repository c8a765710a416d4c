//! The shell every gRPC server here runs in: the service's own routes plus the standard
//! health service and server reflection (v1 and v1alpha, so grpcurl of any age can list and
//! call services without .proto files), served on an already-bound listener until shutdown.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    service::Routes,
    transport::{Identity, Server, ServerTlsConfig, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{metrics::GrpcMetricsLayer, overload::ShedLoadLayer};

/// How often the health service re-checks that the database answers.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// How long a shed request is told to wait before retrying.
const RETRY_AFTER_OVERLOAD: Duration = Duration::from_millis(200);

/// Limits that keep a server responsive under abuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request still running after this is cancelled (CANCELLED).
    pub request_timeout: Duration,
    /// Requests in flight across all connections; more are shed (RESOURCE_EXHAUSTED).
    pub max_concurrent_requests: usize,
}

/// How a server runs: its limits, and TLS when it has a certificate.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    pub limits: Limits,
    /// The server's certificate chain and key; `None` serves plaintext.
    pub tls: Option<Identity>,
}

impl ServerOptions {
    /// The options a service's flags ask for: its limits, and TLS when given a certificate
    /// and key (read here).
    pub fn from_flags(
        request_timeout: Duration,
        max_concurrent_requests: usize,
        tls_cert: Option<&Path>,
        tls_key: Option<&Path>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            limits: Limits {
                request_timeout,
                max_concurrent_requests,
            },
            tls: Self::load_tls(tls_cert, tls_key)?,
        })
    }

    /// Reads a PEM certificate chain and key; both or neither must be given.
    pub fn load_tls(cert: Option<&Path>, key: Option<&Path>) -> anyhow::Result<Option<Identity>> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => {
                let cert = std::fs::read(cert)
                    .with_context(|| format!("cannot read TLS certificate {}", cert.display()))?;
                let key = std::fs::read(key)
                    .with_context(|| format!("cannot read TLS key {}", key.display()))?;
                Ok(Some(Identity::from_pem(cert, key)))
            }
            _ => anyhow::bail!("TLS needs both a certificate and a key (--tls-cert and --tls-key)"),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            max_concurrent_requests: 256,
        }
    }
}

/// A service to serve: its routes, its full name (for health) and its file descriptor set
/// (for reflection).
pub struct ServiceDefinition {
    pub routes: Routes,
    pub name: &'static str,
    pub file_descriptor_set: &'static [u8],
}

/// Serves a service with health and reflection on `listener` until `shutdown` is
/// cancelled, then lets in-flight calls finish.
///
/// Health reports `service_name` (and the server as a whole, `""`) as SERVING while the
/// database answers and NOT_SERVING while it does not.
pub async fn serve(
    listener: TcpListener,
    service: ServiceDefinition,
    options: ServerOptions,
    db: DatabaseConnection,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let ServerOptions { limits, tls } = options;
    let ServiceDefinition {
        routes,
        name: service_name,
        file_descriptor_set,
    } = service;
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let reflection_v1 = reflection(file_descriptor_set)
        .build_v1()
        .context("cannot build reflection v1")?;
    let reflection_v1alpha = reflection(file_descriptor_set)
        .build_v1alpha()
        .context("cannot build reflection v1alpha")?;

    let routes = routes
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);

    // Health knows the service from the first request on: NOT_SERVING until the first
    // database check says otherwise, never "service not registered".
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status(service_name, ServingStatus::NotServing)
        .await;
    let health_task = tokio::spawn(report_database_health(
        reporter,
        service_name,
        db,
        shutdown.clone(),
    ));

    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = Server::builder();
    if let Some(identity) = tls {
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .context("invalid TLS certificate or key")?;
    }
    let served = builder
        .timeout(limits.request_timeout)
        // Outermost, so shed calls are counted too.
        .layer(GrpcMetricsLayer)
        .layer(ShedLoadLayer::new(
            limits.max_concurrent_requests,
            RETRY_AFTER_OVERLOAD,
        ))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
        .await
        .context("grpc server failed");
    health_task.abort();
    served
}

/// Reflection over the served service, the health service (so grpcurl can call
/// `grpc.health.v1.Health/Check` without .proto files too) and the error-detail messages.
fn reflection(file_descriptor_set: &'static [u8]) -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(file_descriptor_set)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // The google.rpc error details, so grpcurl can print BadRequest and ErrorInfo.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
}

async fn report_database_health(
    reporter: HealthReporter,
    service_name: &'static str,
    db: DatabaseConnection,
    shutdown: CancellationToken,
) {
    let mut last = None;
    loop {
        let status = match db.ping().await {
            Ok(()) => ServingStatus::Serving,
            Err(err) => {
                tracing::warn!(error = %err, "database unreachable, health is NOT_SERVING");
                ServingStatus::NotServing
            }
        };
        if last != Some(status) {
            reporter.set_service_status("", status).await;
            reporter.set_service_status(service_name, status).await;
            last = Some(status);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(HEALTH_CHECK_INTERVAL) => {}
        }
    }
}
