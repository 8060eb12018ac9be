//! W3C Trace Context (`traceparent`, `tracestate`): read from a request, handed across the queue.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// A trace context as the two W3C header values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// `traceparent` (`00-<trace id>-<parent id>-<flags>`).
    pub traceparent: String,
    /// `tracestate` (vendor entries; may be empty).
    pub tracestate: String,
}

/// The remote context the two header values describe; an empty context when `traceparent` is absent or
/// malformed (the W3C rule: then a new trace starts, and `tracestate` is dropped with it).
pub fn extract(traceparent: Option<&str>, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::with_capacity(2);
    if let Some(p) = traceparent {
        carrier.insert("traceparent".to_string(), p.trim().to_string());
    }
    if let Some(s) = tracestate {
        carrier.insert("tracestate".to_string(), s.to_string());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// The header values of `cx` (`None` when it holds no valid span context).
pub fn inject(cx: &Context) -> Option<TraceContext> {
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    let traceparent = carrier.remove("traceparent")?;
    Some(TraceContext {
        traceparent,
        tracestate: carrier.remove("tracestate").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_with_its_state() {
        let cx = extract(Some(PARENT), Some("congo=t61rcWkgMzE"));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let back = inject(&cx).unwrap();
        assert_eq!(back.traceparent, PARENT);
        assert_eq!(back.tracestate, "congo=t61rcWkgMzE");
    }

    #[test]
    fn malformed_or_absent_context_starts_a_new_trace() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let cx = extract(Some(bad), Some("k=v"));
            assert!(!cx.span().span_context().is_valid(), "{bad}");
            assert!(inject(&cx).is_none());
        }
        assert!(!extract(None, None).span().span_context().is_valid());
    }
}
