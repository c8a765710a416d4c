//! Spans exported to an OpenTelemetry collector over OTLP/gRPC, when one is named.
//!
//! The ids are the W3C ones every log line already carries ([`crate::trace`]): each hop of a
//! student's journey (the Student call, each delivery of its outbox row, Users' execution)
//! becomes one span whose parent is the hop before it, so a tracing backend (Jaeger, Tempo,
//! …) shows the whole journey, retries and replays included, as one trace.
//!
//! Configured by OpenTelemetry's standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names the collector, and nothing is exported
//! without one; an `https://` one is trusted through the system's roots, or the CA file
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (or `..._TRACES_CERTIFICATE`) names, and shown the client
//! certificate and key `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `..._CLIENT_KEY` name
//! when it asks for one (mutual TLS). `OTEL_SERVICE_NAME`
//! (default: the binary's name), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_BSP_SCHEDULE_DELAY` and the rest are the SDK's own. The protocol is gRPC only:
//! `OTEL_EXPORTER_OTLP_PROTOCOL` set to anything else stops the binary at start.
//!
//! Which traces are exported is the sampler's choice: `OTEL_TRACES_SAMPLER` (and
//! `OTEL_TRACES_SAMPLER_ARG`), `parentbased_always_on` when unset. A trace started here is
//! sampled or not as the sampler decides, from its id; a hop that continues a trace (a
//! caller's, or the one stored with an outbox row) follows the decision it carries in
//! `traceparent`'s flags when the sampler is parent-based. With the same sampler in all
//! three binaries a student's journey is thus exported whole or not at all. A value the
//! sampler cannot use stops the binary at start (the SDK would sample everything instead).
//!
//! Exporting never slows or fails a call: finished spans go to the SDK's batch processor,
//! which sends them from a thread of its own and drops them when its queue is full or the
//! collector is away. A process that stops normally sends what is queued ([`Exporter::stop`]).
//! What became of them is counted for `/metrics`: spans ended (`trace_spans_ended_total`),
//! and spans whose batch the collector took or did not (`trace_spans_exported_total{result}`,
//! `sent` or `failed`).

use std::{borrow::Cow, sync::OnceLock, time::SystemTime};

use anyhow::Context as _;
use anyhow::bail;
use opentelemetry::{
    InstrumentationScope, KeyValue,
    trace::{
        Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
        TraceState,
    },
};
use opentelemetry_otlp::WithTonicConfig as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{
        BatchSpanProcessor, Sampler, SamplingDecision, ShouldSample as _, SpanData, SpanEvents,
        SpanExporter, SpanLinks, SpanProcessor as _,
    },
};

use crate::trace::TraceContext;

/// The variables that name a collector, the first set wins; with neither, nothing is
/// exported.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables that name a PEM file of CA certificates to trust for an `https://`
/// collector, the first set wins; with neither, the system's roots.
const CERTIFICATE_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
];

/// The variables that name a PEM file of the client certificate (chain) this process shows
/// an `https://` collector that asks for one (mutual TLS), the first set wins; with the
/// key below.
const CLIENT_CERTIFICATE_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
];

/// The variables that name a PEM file of that certificate's private key.
const CLIENT_KEY_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];

/// The variables that name the protocol, the first set wins: only `grpc` is built in.
const PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// The processor finished spans go to, once [`start`] has set one up.
static PROCESSOR: OnceLock<BatchSpanProcessor> = OnceLock::new();

/// The sampler new hops are decided by, once [`start`] has set up the export.
static SAMPLER: OnceLock<Sampler> = OnceLock::new();

/// Sets up the export when a collector is named, for the process `service` (its
/// `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` gives one).
/// Call once, inside the Tokio runtime (the exporter's connection runs on it), and keep
/// what it returns.
pub fn start(service: &'static str) -> anyhow::Result<Exporter> {
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    let Some((endpoint_variable, endpoint)) = first_named(&ENDPOINT_VARIABLES) else {
        return Ok(Exporter { exporting: false });
    };
    if disabled || PROCESSOR.get().is_some() {
        return Ok(Exporter { exporting: false });
    }
    if let Some((variable, protocol)) = first_named(&PROTOCOL_VARIABLES)
        && !protocol.trim().eq_ignore_ascii_case("grpc")
    {
        bail!("{variable} {protocol:?} is not built in: spans are exported over grpc only");
    }
    let sampler = sampler_named(
        first_set(&["OTEL_TRACES_SAMPLER"]).as_deref(),
        first_set(&["OTEL_TRACES_SAMPLER_ARG"]).as_deref(),
    )?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if endpoint.starts_with("https://") {
        exporter = exporter.with_tls_config(collector_tls()?);
    }
    let exporter = exporter.build().with_context(|| {
        let tls_files = if endpoint.starts_with("https://") {
            " and the TLS files named (OTEL_EXPORTER_OTLP_CERTIFICATE, \
             OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_KEY)"
        } else {
            ""
        };
        format!(
            "cannot set up the OTLP span exporter: see {endpoint_variable} {endpoint:?}{tls_files}"
        )
    })?;
    let mut processor = BatchSpanProcessor::builder(Counted(exporter)).build();
    // The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, but where both name the
    // service it lets the attributes' `service.name` win; OpenTelemetry's configuration
    // specification says OTEL_SERVICE_NAME wins, and here it does. Neither naming the
    // service, the SDK calls it `unknown_service`: then it is the binary's name.
    let mut resource = Resource::builder().build();
    let named = resource
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|name| {
            let name = name.as_str();
            !name.trim().is_empty() && !name.starts_with("unknown_service")
        });
    let by_variable = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty());
    match by_variable {
        Some(name) => resource = Resource::builder().with_service_name(name).build(),
        None if !named => resource = Resource::builder().with_service_name(service).build(),
        None => {}
    }
    processor.set_resource(&resource);
    let exporting = PROCESSOR.set(processor).is_ok();
    if exporting {
        let _ = SAMPLER.set(sampler);
    }
    Ok(Exporter { exporting })
}

/// OpenTelemetry's sampler called `name` (`OTEL_TRACES_SAMPLER`; unset:
/// `parentbased_always_on`), with the ratio `arg` (`OTEL_TRACES_SAMPLER_ARG`; unset: 1) for
/// the two ratio samplers. The SDK falls back to sampling everything on a value it cannot
/// use; here that is an error, since whoever asked for a tenth of the traces would
/// otherwise get all of them without a word.
fn sampler_named(name: Option<&str>, arg: Option<&str>) -> anyhow::Result<Sampler> {
    let ratio = || match arg {
        None => Ok(1.0),
        Some(arg) => match arg.trim().parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
            _ => Err(anyhow::anyhow!(
                "OTEL_TRACES_SAMPLER_ARG {arg:?} is not a ratio from 0 to 1"
            )),
        },
    };
    let parent_based = |root| Sampler::ParentBased(Box::new(root));
    // Case does not matter, as the specification asks of enumerated values.
    let name = name.map_or_else(
        || "parentbased_always_on".to_owned(),
        |name| name.trim().to_ascii_lowercase(),
    );
    Ok(match name.as_str() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => parent_based(Sampler::AlwaysOn),
        "parentbased_always_off" => parent_based(Sampler::AlwaysOff),
        "parentbased_traceidratio" => parent_based(Sampler::TraceIdRatioBased(ratio()?)),
        other => bail!(
            "OTEL_TRACES_SAMPLER {other:?} is not one of always_on, always_off, traceidratio, \
             parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
        ),
    })
}

/// Whether a hop of the trace `trace_id` is sampled, by the sampler [`start`] set up; its
/// `parent` is the hop it continues (its span id, and whether that was sampled), `None` for
/// a new trace. `None` when no sampler is set up: nothing is exported from this process,
/// and the caller's decision (sampled, for a new trace) is passed on unchanged.
pub(crate) fn sampled(trace_id: u128, parent: Option<(u64, bool)>) -> Option<bool> {
    SAMPLER
        .get()
        .map(|sampler| decide(sampler, trace_id, parent))
}

/// [`sampled`], by `sampler`.
fn decide(sampler: &Sampler, trace_id: u128, parent: Option<(u64, bool)>) -> bool {
    let trace_id = TraceId::from(trace_id);
    let parent = parent.map(|(span_id, sampled)| {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let span = SpanContext::new(
            trace_id,
            SpanId::from(span_id),
            flags,
            true,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(span)
    });
    let decision = sampler
        .should_sample(parent.as_ref(), trace_id, "", &SpanKind::Internal, &[], &[])
        .decision;
    decision == SamplingDecision::RecordAndSample
}

/// Spans ended and handed to the exporter's queue.
pub const SPANS_ENDED: &str = "trace_spans_ended_total";
/// Spans in batches sent to the collector, by `result`: `sent` (it took them) or `failed`
/// (it was away, refused them, or did not answer in time; the SDK does not send them again).
pub const SPANS_EXPORTED: &str = "trace_spans_exported_total";

/// Whether this process exports spans ([`start`] set up a collector).
pub fn exporting() -> bool {
    PROCESSOR.get().is_some()
}

/// The exporter, counting what becomes of each batch it sends.
#[derive(Debug)]
struct Counted<E>(E);

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let exported = self.0.export(batch).await;
        let result = if exported.is_ok() { "sent" } else { "failed" };
        metrics::counter!(SPANS_EXPORTED, "result" => result).increment(spans);
        exported
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// The value of the first of `variables` that is set and not empty.
fn first_set(variables: &[&'static str]) -> Option<String> {
    first_named(variables).map(|(_, value)| value)
}

/// The first of `variables` that is set and not empty, and its value.
fn first_named(variables: &[&'static str]) -> Option<(&'static str, String)> {
    variables.iter().find_map(|&variable| {
        std::env::var(variable)
            .ok()
            .filter(|value| !value.is_empty())
            .map(|value| (variable, value))
    })
}

/// What an `https://` collector is trusted through: the CA file named, or the system's roots.
fn collector_tls() -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    let tls = tonic::transport::ClientTlsConfig::new();
    let tls = match first_set(&CERTIFICATE_VARIABLES) {
        Some(path) => {
            let pem = std::fs::read(&path)
                .with_context(|| format!("cannot read the collector's CA certificate {path}"))?;
            tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
        }
        None => tls.with_native_roots(),
    };
    // A client certificate goes with its key: one without the other is a mistake to name,
    // not a reason to connect without one (the collector would refuse every batch).
    let read = |what: &str, path: &str| {
        std::fs::read(path).with_context(|| format!("cannot read the client {what} {path}"))
    };
    match (
        first_named(&CLIENT_CERTIFICATE_VARIABLES),
        first_named(&CLIENT_KEY_VARIABLES),
    ) {
        (Some((_, certificate)), Some((_, key))) => {
            Ok(tls.identity(tonic::transport::Identity::from_pem(
                read("certificate", &certificate)?,
                read("key", &key)?,
            )))
        }
        // The missing one is asked for in the form (`..._TRACES_...` or not) of the one named.
        (Some((named, _)), None) => bail!(
            "{named} names a client certificate but no key is named for it ({})",
            named.replace("CLIENT_CERTIFICATE", "CLIENT_KEY")
        ),
        (None, Some((named, _))) => bail!(
            "{named} names a client key but no certificate is named for it ({})",
            named.replace("CLIENT_KEY", "CLIENT_CERTIFICATE")
        ),
        (None, None) => Ok(tls),
    }
}

/// The longest a stopping binary waits for the collector to take its last spans (the SDK's
/// default, named here because README promises it): a collector that never answers holds
/// a stop this long, not the export's own deadline (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The export [`start`] set up, if any.
#[must_use = "stop it when the process ends, or the last spans are lost"]
pub struct Exporter {
    exporting: bool,
}

impl Exporter {
    /// Sends the spans still queued and stops the export (waiting at most [`STOP_WAIT`] when
    /// the collector does not answer). The processor's thread waits on a connection that runs
    /// on this runtime, so it is waited for off the runtime's thread.
    pub async fn stop(self) {
        if !self.exporting {
            return;
        }
        let stopped = tokio::task::spawn_blocking(|| {
            PROCESSOR
                .get()
                .map(|processor| processor.shutdown_with_timeout(STOP_WAIT))
        })
        .await;
        if let Ok(Some(Err(err))) = stopped {
            tracing::warn!(error = %err, "spans still queued for the collector were not sent");
        }
    }
}

/// One hop of a trace, exported when it ends: [`ExportedSpan::end`] with the gRPC code it
/// ended with, or dropped (ended without a status). A no-op when nothing is exported or
/// the trace is not sampled.
#[must_use = "a span is exported when it ends"]
pub struct ExportedSpan(Option<Box<Open>>);

/// Whether a span of `kind` whose call ended with `code` is an error, by OpenTelemetry's
/// gRPC conventions: a client span for every code but `OK`; a server span only for the
/// codes that mean the server failed, since a refused request is the caller's error.
fn is_error(kind: &SpanKind, code: tonic::Code) -> bool {
    match kind {
        SpanKind::Server => matches!(
            code,
            tonic::Code::Unknown
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unimplemented
                | tonic::Code::Internal
                | tonic::Code::Unavailable
                | tonic::Code::DataLoss
        ),
        _ => code != tonic::Code::Ok,
    }
}

struct Open {
    trace: TraceContext,
    name: Cow<'static, str>,
    kind: SpanKind,
    /// Whether the parent is another process's span (a caller's, or the Student call that
    /// stored an outbox row) rather than one of this process's.
    remote_parent: bool,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    links: Vec<TraceContext>,
    status: Status,
}

impl ExportedSpan {
    /// A hop that serves a call: `service/method` (`student.v1.StudentService/CreateStudent`).
    pub fn server(trace: TraceContext, service: &'static str, method: &'static str) -> Self {
        Self::start(trace, SpanKind::Server, true, service, method)
    }

    /// A hop that calls another process's `service/method` on behalf of another process's
    /// span: the relay delivering a row the Student call stored.
    pub fn client(trace: TraceContext, service: &'static str, method: &'static str) -> Self {
        Self::start(trace, SpanKind::Client, true, service, method)
    }

    /// A hop that calls another process's `service/method` from within this process's own
    /// span (the parent): the direct flow's CreateStudent calling Users.
    pub fn client_of_this_call(
        trace: TraceContext,
        service: &'static str,
        method: &'static str,
    ) -> Self {
        Self::start(trace, SpanKind::Client, false, service, method)
    }

    fn start(
        trace: TraceContext,
        kind: SpanKind,
        remote_parent: bool,
        service: &'static str,
        method: &'static str,
    ) -> Self {
        if PROCESSOR.get().is_none() || !trace.is_sampled() {
            return Self(None);
        }
        Self(Some(Box::new(Open {
            trace,
            name: format!("{service}/{method}").into(),
            kind,
            remote_parent,
            start: SystemTime::now(),
            attributes: vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service),
                KeyValue::new("rpc.method", method),
            ],
            links: Vec::new(),
            status: Status::Unset,
        })))
    }

    /// Adds an attribute (never personal data: ids, counts, outcomes).
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(open) = &mut self.0 {
            open.attributes.push(KeyValue::new(key, value));
        }
    }

    /// Links the span to another hop, of this trace or another: a call that carries many
    /// rows, each in its own trace, to each row's span.
    pub fn link(&mut self, to: TraceContext) {
        if let Some(open) = &mut self.0 {
            open.links.push(to);
        }
    }

    /// Ends the span with the gRPC code its call ended with. As OpenTelemetry's gRPC
    /// conventions say, a client span is an error for every code but `OK`, and a server
    /// span only for the codes that mean the server failed (a refused request is the
    /// caller's error, not the server's).
    pub fn end(mut self, code: tonic::Code, message: &str) {
        if let Some(open) = &mut self.0 {
            open.attributes
                .push(KeyValue::new("rpc.grpc.status_code", code as i64));
            if is_error(&open.kind, code) {
                open.status = Status::error(message.to_owned());
            }
        }
    }

    /// Ends the span as failed, for `reason`. (A span dropped without [`ExportedSpan::end`]
    /// or this ends without a status: done, as far as it knows.)
    pub fn fail(mut self, reason: &str) {
        if let Some(open) = &mut self.0 {
            open.status = Status::error(reason.to_owned());
        }
    }

    /// Ends the span with a call's result, and passes the result on.
    pub fn ended<T>(self, result: Result<T, tonic::Status>) -> Result<T, tonic::Status> {
        match &result {
            Ok(_) => self.end(tonic::Code::Ok, ""),
            Err(status) => self.end(status.code(), status.message()),
        }
        result
    }
}

impl Drop for ExportedSpan {
    fn drop(&mut self) {
        let (Some(open), Some(processor)) = (self.0.take(), PROCESSOR.get()) else {
            return;
        };
        metrics::counter!(SPANS_ENDED).increment(1);
        let Open {
            trace,
            name,
            kind,
            remote_parent,
            start,
            attributes,
            links,
            status,
        } = *open;
        let mut span_links = SpanLinks::default();
        span_links.links = links
            .into_iter()
            .map(|to| Link::new(context_of(to), Vec::new(), 0))
            .collect();
        processor.on_end(SpanData {
            span_context: context_of(trace),
            parent_span_id: trace.parent_span_id().map_or(SpanId::INVALID, SpanId::from),
            parent_span_is_remote: remote_parent && trace.parent_span_id().is_some(),
            span_kind: kind,
            name,
            start_time: start,
            end_time: SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: span_links,
            status,
            instrumentation_scope: scope().clone(),
        });
    }
}

/// A hop's ids as OpenTelemetry's span context (sampled: only sampled hops are exported).
fn context_of(trace: TraceContext) -> SpanContext {
    SpanContext::new(
        TraceId::from(trace.trace_id_value()),
        SpanId::from(trace.span_id()),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

fn scope() -> &'static InstrumentationScope {
    static SCOPE: OnceLock<InstrumentationScope> = OnceLock::new();
    SCOPE.get_or_init(|| {
        InstrumentationScope::builder("student-users-outbox")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trace ids whose low 64 bits, halved, fall below any ratio above 0 (`IN`) and above
    /// any ratio below 1 (`OUT`): OpenTelemetry's ratio samplers decide from those bits.
    const IN: u128 = 0x4bf9_2f35_77b3_4da6_0000_0000_0000_0000;
    const OUT: u128 = 0x4bf9_2f35_77b3_4da6_ffff_ffff_ffff_ffff;
    const PARENT_SPAN: u64 = 0x00f0_67aa_0ba9_02b7;

    fn decisions(name: &str, arg: Option<&str>) -> [bool; 6] {
        let sampler = sampler_named(Some(name), arg).expect("a sampler");
        let decide = |trace_id, parent| decide(&sampler, trace_id, parent);
        [
            decide(IN, None),
            decide(OUT, None),
            decide(IN, Some((PARENT_SPAN, true))),
            decide(OUT, Some((PARENT_SPAN, true))),
            decide(IN, Some((PARENT_SPAN, false))),
            decide(OUT, Some((PARENT_SPAN, false))),
        ]
    }

    /// Each sampler `OTEL_TRACES_SAMPLER` can name, deciding a new trace (`None`: no
    /// parent) and a continued one, whose parent was sampled or not, for a trace id in and
    /// one out of the ratio.
    #[test]
    fn each_sampler_decides_as_its_name_says() {
        // New trace: IN, OUT; sampled parent: IN, OUT; parent not sampled: IN, OUT.
        let cases = [
            ("always_on", None, [true; 6]),
            ("always_off", None, [false; 6]),
            (
                "traceidratio",
                Some("0.5"),
                [true, false, true, false, true, false],
            ),
            (
                "parentbased_always_on",
                None,
                [true, true, true, true, false, false],
            ),
            (
                "parentbased_always_off",
                None,
                [false, false, true, true, false, false],
            ),
            (
                "parentbased_traceidratio",
                Some("0.5"),
                [true, false, true, true, false, false],
            ),
            // 1, the ratio's maximum (and its default), keeps everything.
            (
                "traceidratio",
                Some("1"),
                [true, true, true, true, true, true],
            ),
            // The ratio defaults to 1: everything, as the specification says.
            (
                "parentbased_traceidratio",
                None,
                [true, true, true, true, false, false],
            ),
            ("traceidratio", Some("0"), [false; 6]),
        ];
        for (name, arg, expected) in cases {
            assert_eq!(decisions(name, arg), expected, "{name} {arg:?}");
        }
        // Names are not case-sensitive, nor spaces around them.
        assert_eq!(
            decisions(" ParentBased_TraceIdRatio ", Some("0.5")),
            decisions("parentbased_traceidratio", Some("0.5"))
        );
        let unset = sampler_named(None, None).expect("the default");
        assert!(decide(&unset, OUT, None));
        assert!(!decide(&unset, IN, Some((PARENT_SPAN, false))));
    }

    /// The trace ids this code makes for new traces fall in a ratio at its rate: a quarter
    /// of them in a ratio of 0.25. (UUIDv4s, once used, have fixed bits where the ratio
    /// looks, and none of them fell in.)
    #[test]
    fn a_ratio_samples_its_share_of_new_traces() {
        let sampler = sampler_named(Some("traceidratio"), Some("0.25")).expect("a sampler");
        let sampled = (0..4000)
            .map(|_| TraceContext::new_root().trace_id_value())
            .filter(|&trace_id| decide(&sampler, trace_id, None))
            .count();
        // 1,000 expected; beyond ±200 is more than six standard deviations away.
        assert!((800..=1200).contains(&sampled), "{sampled} of 4000");
    }

    /// README ("Following one student"): which of the 17 codes make a span an error.
    #[test]
    fn a_server_span_is_an_error_only_when_the_server_failed_a_client_span_for_any_code_but_ok() {
        use tonic::Code::*;
        let all = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        let server_errors: Vec<_> = all
            .into_iter()
            .filter(|&code| is_error(&SpanKind::Server, code))
            .collect();
        assert_eq!(
            server_errors,
            [
                Unknown,
                DeadlineExceeded,
                Unimplemented,
                Internal,
                Unavailable,
                DataLoss
            ]
        );
        let client_errors: Vec<_> = all
            .into_iter()
            .filter(|&code| is_error(&SpanKind::Client, code))
            .collect();
        assert_eq!(client_errors, all[1..]);
    }

    #[test]
    fn a_sampler_or_ratio_it_cannot_use_is_an_error_naming_it() {
        for (name, arg, named) in [
            ("sometimes", None, "sometimes"),
            ("jaeger_remote", None, "jaeger_remote"),
            ("traceidratio", Some("2"), "\"2\""),
            ("parentbased_traceidratio", Some("-0.1"), "-0.1"),
            ("traceidratio", Some("half"), "half"),
        ] {
            let err = sampler_named(Some(name), arg).expect_err(name);
            assert!(err.to_string().contains(named), "{name} {arg:?}: {err}");
        }
    }
}
