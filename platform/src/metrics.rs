//! Metrics for every binary: code records through the `metrics` facade; with
//! `--metrics-addr` the process installs the Prometheus recorder and serves its text format
//! at `GET /metrics`. Without the flag nothing is installed and every recording is a no-op.
//!
//! Both gRPC servers count their calls under the names the gRPC ecosystem already
//! dashboards (those of go-grpc-prometheus): `grpc_server_handled_total` and
//! `grpc_server_handling_seconds`, see [`GrpcMetricsLayer`].

use std::{
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{Code, body::Body};
use tower::{Layer, Service};

use crate::status::code_name;

/// Histogram buckets in seconds, for every histogram here: from a millisecond (a replay
/// answered from the inbox) to an hour (a row that waited out an outage).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// How often histograms are folded and idle state dropped (the exporter's upkeep).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

pub const GRPC_HANDLED: &str = "grpc_server_handled_total";
pub const GRPC_HANDLING_SECONDS: &str = "grpc_server_handling_seconds";
pub const LOG_LINES_DROPPED: &str = "log_lines_dropped_total";

/// Installs the Prometheus recorder for this process and serves `GET /metrics` on `addr`
/// (port 0 picks a free one) until `shutdown`. Logs `metrics_addr=ADDR` once listening.
/// Call at most once per process, before any metric is recorded.
pub async fn serve(
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let handle = PrometheusBuilder::new()
        .set_buckets(SECONDS_BUCKETS)
        .context("invalid histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    describe_metrics();
    if crate::otlp::exporting() {
        // From the first scrape, so that `increase()` sees the first span of each.
        metrics::counter!(crate::otlp::SPANS_ENDED).increment(0);
        for result in ["sent", "failed"] {
            metrics::counter!(crate::otlp::SPANS_EXPORTED, "result" => result).increment(0);
        }
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!(metrics_addr = %local, "serving Prometheus metrics at /metrics");
    let render = handle.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                show_dropped_lines(crate::telemetry::dropped_lines());
                render.render()
            }
        }),
    );
    tokio::spawn(upkeep(handle, shutdown.clone()));
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(err) = served {
            tracing::error!(error = %err, "metrics endpoint failed");
        }
    }))
}

/// The log writer counts for itself; each scrape shows its running count as the counter's
/// value (never adds it again: `increase()` would then never fall back to 0).
fn show_dropped_lines(dropped: u64) {
    metrics::counter!(LOG_LINES_DROPPED).absolute(dropped);
}

/// Starts the metrics endpoint when an address is given.
pub async fn serve_if_asked(
    addr: Option<SocketAddr>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    if let Some(addr) = addr {
        serve(addr, shutdown.clone()).await?;
    }
    Ok(())
}

async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(UPKEEP_INTERVAL) => handle.run_upkeep(),
        }
    }
}

fn describe_metrics() {
    metrics::describe_counter!(
        GRPC_HANDLED,
        "gRPC calls completed by the server, by service, method and status code (shed calls included)"
    );
    metrics::describe_histogram!(
        GRPC_HANDLING_SECONDS,
        metrics::Unit::Seconds,
        "Time from a call's arrival to its status"
    );
    metrics::describe_counter!(
        LOG_LINES_DROPPED,
        "Log lines dropped: stderr's reader did not keep up (the writer's queue was full), or writing them failed"
    );
    metrics::describe_counter!(
        crate::otlp::SPANS_ENDED,
        "Spans ended and handed to the OTLP exporter's queue (only with a collector named)"
    );
    metrics::describe_counter!(
        crate::otlp::SPANS_EXPORTED,
        "Spans in batches sent to the OTLP collector: sent (taken) or failed (lost)"
    );
    metrics::describe_counter!(
        crate::db::SQLITE_WRITE_LOCK_WAITS,
        "SQLite only: 1 ms pauses of this process's writers while another connection held the write lock"
    );
}

/// Counts every call the server answers, shed and timed-out ones included, by service,
/// method and status code, and times it. A call whose status comes in the trailers (every
/// successful one) is counted when its body ends; a call the client abandons, or the
/// server's deadline cancels, counts as `CANCELLED`. A path naming no served method counts
/// as service and method `unknown`, so a scanner cannot grow the label sets.
#[derive(Clone, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// The service [`GrpcMetricsLayer`] wraps around the routes.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call::start(request.uri().path());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            match grpc_status(response.headers()) {
                // Trailers-only: every error answer, shed calls among them.
                Some(code) => {
                    call.finish(code);
                    Ok(response)
                }
                None => Ok(response.map(|body| {
                    Body::new(ObservedBody {
                        inner: body,
                        call: Some(call),
                    })
                })),
            }
        })
    }
}

/// One call being timed; counted exactly once, as `CANCELLED` if dropped unfinished.
struct Call {
    path: String,
    started: Instant,
    finished: bool,
}

impl Call {
    fn start(path: &str) -> Self {
        Self {
            path: path.to_owned(),
            started: Instant::now(),
            finished: false,
        }
    }

    fn finish(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let (service, method) = if code == Code::Unimplemented {
            ("unknown", "unknown")
        } else {
            split_path(&self.path)
        };
        let labels = [
            ("grpc_service", service.to_owned()),
            ("grpc_method", method.to_owned()),
        ];
        metrics::histogram!(GRPC_HANDLING_SECONDS, &labels).record(self.started.elapsed());
        metrics::counter!(
            GRPC_HANDLED,
            &[
                labels[0].clone(),
                labels[1].clone(),
                ("grpc_code", code_name(code).to_owned()),
            ]
        )
        .increment(1);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// `/pkg.Service/Method` → (`pkg.Service`, `Method`); anything else is `unknown`.
fn split_path(path: &str) -> (&str, &str) {
    path.strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .filter(|(service, method)| !service.is_empty() && !method.is_empty())
        .unwrap_or(("unknown", "unknown"))
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from_i32(value.parse().ok()?))
}

/// A response body that counts its call when the trailers carrying the status pass.
struct ObservedBody {
    inner: Body,
    call: Option<Call>,
}

impl http_body::Body for ObservedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let code = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame.trailers_ref().and_then(grpc_status),
            Poll::Ready(Some(Err(_))) => Some(Code::Internal),
            // A body that ends without a status: the client sees no status either.
            Poll::Ready(None) => Some(Code::Unknown),
            Poll::Pending => None,
        };
        if let Some(code) = code
            && let Some(call) = self.call.take()
        {
            call.finish(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scrapes show the writer's running count, however many there are between drops.
    #[test]
    fn each_scrape_shows_the_dropped_lines_counted_so_far() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            for dropped in [0, 5, 5, 5, 7] {
                show_dropped_lines(dropped);
            }
        });
        let text = recorder.handle().render();
        assert!(text.contains("\nlog_lines_dropped_total 7\n"), "{text}");
    }

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(
            split_path("/student.v1.StudentService/CreateStudent"),
            ("student.v1.StudentService", "CreateStudent")
        );
        assert_eq!(split_path("/"), ("unknown", "unknown"));
        assert_eq!(split_path("/only"), ("unknown", "unknown"));
        assert_eq!(split_path("//Method"), ("unknown", "unknown"));
        assert_eq!(split_path("no-slash"), ("unknown", "unknown"));
    }

    /// A call the server has no method for (a scanner trying paths) is counted under
    /// `unknown`, so its path never becomes a label value; a served call keeps its names,
    /// and a call dropped unfinished is counted once, as CANCELLED.
    #[test]
    fn unserved_paths_are_counted_as_unknown_and_each_call_once() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            Call::start("/scan.Me/Nope").finish(Code::Unimplemented);
            Call::start("/users.v1.UsersService/GetUser").finish(Code::NotFound);
            drop(Call::start("/users.v1.UsersService/CreateUser"));
        });
        let text = recorder.handle().render();
        let mut handled: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("grpc_server_handled_total{"))
            .collect();
        handled.sort_unstable();
        assert_eq!(
            handled,
            [
                "grpc_server_handled_total{grpc_service=\"unknown\",grpc_method=\"unknown\",grpc_code=\"UNIMPLEMENTED\"} 1",
                "grpc_server_handled_total{grpc_service=\"users.v1.UsersService\",grpc_method=\"CreateUser\",grpc_code=\"CANCELLED\"} 1",
                "grpc_server_handled_total{grpc_service=\"users.v1.UsersService\",grpc_method=\"GetUser\",grpc_code=\"NOT_FOUND\"} 1",
            ],
            "{text}"
        );
    }
}
