//! W3C trace context (`traceparent`): one trace id follows a student from CreateStudent (or
//! any change) through its outbox row and the relay to Users, so every log line about it,
//! in all three processes, carries the same `trace_id`. Each hop is a span of its own,
//! whose parent is the caller's; with a collector named, the hops are exported over OTLP
//! with these ids ([`crate::otlp`]).
//!
//! `traceparent` is `00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>`
//! (<https://www.w3.org/TR/trace-context/>). An absent or malformed one starts a new trace,
//! as the recommendation says: tracing never refuses a request.

use std::fmt;

use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
use tonic::metadata::{MetadataMap, MetadataValue};

/// The metadata entry (and header) that carries the context.
pub const TRACEPARENT: &str = "traceparent";

/// One hop of a trace: the trace it belongs to and this hop's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    /// The caller's span, or 0 for the first hop of a trace.
    parent_span_id: u64,
    flags: u8,
}

impl TraceContext {
    /// A new trace, for a request that arrived without one: sampled as the sampler set up
    /// by [`crate::otlp::start`] decides from its id, or always when there is none.
    pub fn new_root() -> Self {
        let trace_id = nonzero_u128();
        let sampled = crate::otlp::sampled(trace_id, None).unwrap_or(true);
        Self {
            trace_id,
            span_id: nonzero_u64(),
            parent_span_id: 0,
            flags: u8::from(sampled),
        }
    }

    /// Parses a `traceparent` value; `None` when it is not a valid one.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four parts; later versions may append more.
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let lower_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version, 2)
            || !lower_hex(trace_id, 32)
            || !lower_hex(span_id, 16)
            || !lower_hex(flags, 2)
        {
            return None;
        }
        let context = Self {
            trace_id: u128::from_str_radix(trace_id, 16).ok()?,
            span_id: u64::from_str_radix(span_id, 16).ok()?,
            parent_span_id: 0,
            flags: u8::from_str_radix(flags, 16).ok()?,
        };
        (context.trace_id != 0 && context.span_id != 0).then_some(context)
    }

    /// The context a request carries in its `traceparent` metadata, continued by a span of
    /// this process; a new trace when there is none or it is malformed.
    pub fn continue_from(metadata: &MetadataMap) -> Self {
        metadata
            .get(TRACEPARENT)
            .and_then(|value| value.to_str().ok())
            .and_then(Self::parse)
            .map_or_else(Self::new_root, |parent| parent.child())
    }

    /// Like [`TraceContext::continue_from`], and records the trace id as the `trace_id`
    /// field of the current span (a gRPC handler's, declared with `fields(trace_id)`), so
    /// every log line of the call carries it.
    pub fn continue_in_current_span(metadata: &MetadataMap) -> Self {
        let trace = Self::continue_from(metadata);
        tracing::Span::current().record(
            crate::telemetry::TRACE_ID_FIELD,
            tracing::field::display(trace.trace_id()),
        );
        trace
    }

    /// The context stored with a row (`outbox.traceparent`), continued by a span of this
    /// process; a new trace for a row stored without one.
    pub fn continue_stored(stored: Option<&str>) -> Self {
        stored
            .and_then(Self::parse)
            .map_or_else(Self::new_root, |parent| parent.child())
    }

    /// The next hop: the same trace, a new span whose parent is this one, sampled as the
    /// sampler set up by [`crate::otlp::start`] decides (a parent-based one follows this
    /// hop), or as this hop is when there is none. The other flags are passed on.
    pub fn child(self) -> Self {
        let sampled = crate::otlp::sampled(self.trace_id, Some((self.span_id, self.is_sampled())))
            .unwrap_or(self.is_sampled());
        Self {
            span_id: nonzero_u64(),
            parent_span_id: self.span_id,
            flags: (self.flags & !0x01) | u8::from(sampled),
            ..self
        }
    }

    /// The trace id, as a number.
    pub fn trace_id_value(&self) -> u128 {
        self.trace_id
    }

    /// This hop's span id.
    pub fn span_id(&self) -> u64 {
        self.span_id
    }

    /// The caller's span id; `None` for the first hop of a trace.
    pub fn parent_span_id(&self) -> Option<u64> {
        (self.parent_span_id != 0).then_some(self.parent_span_id)
    }

    /// Whether the trace is sampled (flag `01`): only sampled hops are exported.
    pub fn is_sampled(&self) -> bool {
        self.flags & 0x01 == 0x01
    }

    /// The trace id as 32 lowercase hex digits: what every log line about the work carries.
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// Adds this context to outgoing metadata, as the parent of the callee's span.
    pub fn inject(&self, metadata: &mut MetadataMap) {
        // Always ASCII hex and dashes.
        if let Ok(value) = MetadataValue::try_from(self.to_string()) {
            metadata.insert(TRACEPARENT, value);
        }
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// A random trace id, every bit random: the ratio samplers decide from its low 64 bits, so
/// an id with fixed bits there (a UUIDv4's variant) would be sampled at the wrong rate.
/// OpenTelemetry's own generator (a per-thread generator seeded from the OS).
fn nonzero_u128() -> u128 {
    loop {
        let id = u128::from_be_bytes(RandomIdGenerator::default().new_trace_id().to_bytes());
        if id != 0 {
            return id;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let id = u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes());
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips_and_continues_its_trace() {
        let parsed = TraceContext::parse(EXAMPLE).expect("valid");
        assert_eq!(parsed.to_string(), EXAMPLE);
        assert_eq!(parsed.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = parsed.child();
        assert_eq!(child.trace_id(), parsed.trace_id());
        assert_ne!(child.to_string(), parsed.to_string());
        let mut metadata = MetadataMap::new();
        metadata.insert(TRACEPARENT, EXAMPLE.parse().expect("ascii"));
        assert_eq!(
            TraceContext::continue_from(&metadata).trace_id(),
            parsed.trace_id()
        );
        assert_eq!(
            TraceContext::continue_stored(Some(EXAMPLE)).trace_id(),
            parsed.trace_id()
        );
    }

    /// A process continuing a trace, a request's or a stored row's, is a new hop: the
    /// caller's trace id and flags (sampled or not), but a span id of its own, never the
    /// caller's.
    #[test]
    fn continuing_a_trace_keeps_its_id_and_flags_but_starts_a_new_span() {
        // 02 and 03: W3C's random-trace-id flag, which is not this hop's to drop.
        for flags in ["01", "00", "03", "02"] {
            let traceparent =
                format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
            let parent = TraceContext::parse(&traceparent).expect("valid");
            let mut metadata = MetadataMap::new();
            metadata.insert(TRACEPARENT, traceparent.parse().expect("ascii"));
            for (from, continued) in [
                ("metadata", TraceContext::continue_from(&metadata)),
                ("a row", TraceContext::continue_stored(Some(&traceparent))),
            ] {
                assert_eq!(continued.trace_id, parent.trace_id, "{from}: {traceparent}");
                assert_eq!(continued.flags, parent.flags, "{from}: {traceparent}");
                assert_ne!(continued.span_id, parent.span_id, "{from}: {traceparent}");
                assert_eq!(
                    continued.parent_span_id(),
                    Some(parent.span_id),
                    "{from}: the caller's span is the parent"
                );
                assert_eq!(
                    continued.is_sampled(),
                    u8::from_str_radix(flags, 16).expect("hex") & 1 == 1,
                    "{from}"
                );
                assert_ne!(continued.span_id, 0, "{from}: {traceparent}");
                assert_ne!(continued.to_string(), traceparent, "{from}");
                assert!(
                    continued.to_string().ends_with(&format!("-{flags}")),
                    "{from}: {continued}"
                );
            }
        }
    }

    #[test]
    fn a_malformed_traceparent_starts_a_new_trace() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        // A later version may append parts (W3C): its first four are read as version 00's.
        let later = TraceContext::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-next",
        )
        .expect("a later version, read");
        assert_eq!(later.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(later.is_sampled());
        assert_eq!(TraceContext::new_root().parent_span_id(), None);
        let fresh = TraceContext::continue_stored(Some("garbage"));
        assert_eq!(fresh.trace_id().len(), 32);
        assert_ne!(fresh.trace_id(), "0".repeat(32));
        assert_ne!(
            TraceContext::new_root().trace_id(),
            TraceContext::new_root().trace_id()
        );
    }
}
