//! An OpenTelemetry collector's receiving side, in the test process: an OTLP/gRPC
//! `TraceService` on a port of its own that keeps every span the binaries export.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
    trace::v1::Span,
};
use tokio::net::TcpListener;
use tonic::{
    Request, Response, Status,
    transport::{Certificate, Identity, ServerTlsConfig, server::TcpIncoming},
};

/// One exported span, with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub span: Span,
}

impl ReceivedSpan {
    /// A string or integer attribute's value, as text.
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|value| match value {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                other => format!("{other:?}"),
            })
    }
}

/// The collector; dropped, it stops serving.
pub struct Collector {
    addr: SocketAddr,
    tls: bool,
    received: Arc<Mutex<Vec<ReceivedSpan>>>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Receiver(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = self.0.lock().expect("not poisoned");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                received.extend(scope_spans.spans.into_iter().map(|span| ReceivedSpan {
                    service: service.clone(),
                    span,
                }));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// A collector over plaintext (`http://`).
    pub async fn start() -> Self {
        Self::serve(None).await
    }

    /// A collector over TLS (`https://`), with `identity`'s certificate.
    pub async fn start_tls(identity: Identity) -> Self {
        Self::serve(Some(ServerTlsConfig::new().identity(identity))).await
    }

    /// [`Collector::start_tls`], taking only exporters that show a client certificate
    /// `client_ca` signed (mutual TLS).
    pub async fn start_mutual_tls(identity: Identity, client_ca: Certificate) -> Self {
        let config = ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(client_ca);
        Self::serve(Some(config)).await
    }

    async fn serve(config: Option<ServerTlsConfig>) -> Self {
        let tls = config.is_some();
        let mut builder = tonic::transport::Server::builder();
        if let Some(config) = config {
            builder = builder.tls_config(config).expect("TLS settings");
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the collector");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::default();
        let service = TraceServiceServer::new(Receiver(Arc::clone(&received)));
        let server = tokio::spawn(async move {
            builder
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .expect("the collector serves");
        });
        Self {
            addr,
            tls,
            received,
            server,
        }
    }

    /// What a binary's `OTEL_EXPORTER_OTLP_ENDPOINT` names to export here.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().expect("not poisoned").clone()
    }

    /// Every span received so far of the trace `trace_id` (32 hex digits).
    pub fn spans_of(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.received
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|received| hex(&received.span.trace_id) == trace_id)
            .cloned()
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Bytes as lowercase hex, as W3C ids are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
