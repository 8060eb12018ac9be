//! Logs and OpenTelemetry traces for both processes (the server and the reranker worker).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). Traces: the spans created with target
//! [`TARGET`] become OpenTelemetry spans; with an OTLP endpoint configured they are exported (HTTP/protobuf
//! or gRPC) by a batch processor on a thread of its own, the network calls on a small runtime of their own, so
//! exporting never runs on a request's or a job's thread; a full export queue drops spans, never waits.
//! Without an endpoint spans still carry W3C trace ids (for the response header and the log lines) and nothing
//! is recorded.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

mod export;
pub mod w3c;

pub use opentelemetry::KeyValue;

/// The target of the spans that become OpenTelemetry spans (`tracing::info_span!(target: TARGET, …)`).
pub const TARGET: &str = "tiergate::trace";

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`POST {endpoint}/v1/traces`).
    HttpProtobuf,
    /// OTLP/gRPC (`TraceService/Export`).
    Grpc,
}

impl Protocol {
    /// Parses the `OTEL_EXPORTER_OTLP_PROTOCOL` spelling.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "http/protobuf" | "http" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            other => anyhow::bail!(
                "OTLP protocol `{other}` is not supported: use `http/protobuf` or `grpc`"
            ),
        }
    }

    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// Where and how traces are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The full URL spans are sent to (`…/v1/traces` for HTTP; the collector's address for gRPC).
    pub url: String,
    /// The transport.
    pub protocol: Protocol,
    /// `service.name` of this process.
    pub service_name: String,
    /// Share of new traces recorded (a request carrying a `traceparent` follows its sampled flag).
    pub sample_ratio: f64,
    /// False for a process that only continues traces (the worker): it starts no trace of its own.
    pub roots: bool,
}

impl Export {
    /// Resolves the export from the config's values (`endpoint`, `protocol`: empty for "not set") and the
    /// standard variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (a base: `/v1/traces` is appended for HTTP), `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME`. The
    /// config wins over the environment. `None`: no endpoint anywhere (tracing off).
    pub fn resolve(
        endpoint: &str,
        protocol: &str,
        sample_ratio: f64,
        service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<Self>> {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let protocol = match (protocol, var("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            ("", None) => Protocol::HttpProtobuf,
            ("", Some(p)) => Protocol::parse(p.trim())?,
            (p, _) => Protocol::parse(p)?,
        };
        let (base, full) = if !endpoint.is_empty() {
            (endpoint.to_string(), false)
        } else if let Some(u) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            (u, true)
        } else if let Some(u) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            (u, false)
        } else {
            return Ok(None);
        };
        let base = base.trim().to_string();
        let uri: http::Uri = base
            .parse()
            .map_err(|e| anyhow::anyhow!("OTLP endpoint `{base}`: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            anyhow::bail!("OTLP endpoint `{base}`: use an http:// or https:// URL with a host");
        }
        if !(0.0..=1.0).contains(&sample_ratio) {
            anyhow::bail!("trace sample ratio {sample_ratio}: use a value in [0, 1]");
        }
        let url = match protocol {
            Protocol::HttpProtobuf if !full && !base.ends_with("/v1/traces") => {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
            _ => base,
        };
        Ok(Some(Self {
            url,
            protocol,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| service.to_string()),
            sample_ratio,
            roots: true,
        }))
    }
}

/// The installed telemetry. Dropping it flushes the spans not yet exported (up to 2 s).
pub struct Telemetry(());

/// The export in force in this process, when tracing is on.
pub fn export() -> Option<&'static Export> {
    EXPORT.get().and_then(Option::as_ref)
}

static EXPORT: OnceLock<Option<Export>> = OnceLock::new();

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = PROVIDER.get() {
            let _ = p.shutdown_with_timeout(Duration::from_secs(2));
        }
    }
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
static TRACER: OnceLock<opentelemetry_sdk::trace::SdkTracer> = OnceLock::new();

/// Installs the global subscriber: logs on stderr, and spans of [`TARGET`] as OpenTelemetry spans, exported
/// when `export` is given. Call once per process.
pub fn init(export: Option<Export>) -> anyhow::Result<Telemetry> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = match &export {
        Some(e) => export::provider(e)?,
        // Ids without recording: the spans are sampled out, their contexts stay valid.
        None => SdkTracerProvider::builder()
            .with_sampler(Sampler::AlwaysOff)
            .build(),
    };
    let tracer = provider.tracer("tiergate");
    let _ = TRACER.set(tracer.clone());
    let _ = PROVIDER.set(provider);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE),
        );
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        );
    tracing_subscriber::registry()
        .with(otel)
        .with(logs)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    if let Some(e) = &export {
        tracing::info!(url = %e.url, protocol = e.protocol.as_str(), service = %e.service_name,
            sample_ratio = e.sample_ratio, "exporting traces (OTLP)");
    }
    let _ = EXPORT.set(export);
    Ok(Telemetry(()))
}

/// Exports the spans ended so far (a process about to exit calls it; waits at most the export timeout).
pub fn flush() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// Makes `span` continue the trace of `parent` (a remote context from [`w3c::extract`]); a no-op for an
/// invalid context (then the span starts a new trace).
pub fn set_parent(span: &tracing::Span, parent: Context) {
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The trace id of `span` (32 hex digits), when it has one.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The W3C context of `span`, to hand to another process (`None` when it has none).
pub fn context_of(span: &tracing::Span) -> Option<w3c::TraceContext> {
    w3c::inject(&span.context())
}

/// Records a finished step as a child span of `parent` with explicit times: for work measured elsewhere
/// (the prefilter's batching thread reports its tokenise / queue / infer durations).
pub fn record_child(
    parent: &tracing::Span,
    name: &'static str,
    start: std::time::SystemTime,
    end: std::time::SystemTime,
    attributes: Vec<KeyValue>,
) {
    use opentelemetry::trace::{Span as _, Tracer as _};
    let cx = parent.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let Some(tracer) = TRACER.get() else { return };
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(tracer, &cx);
    span.end_with_timestamp(end);
}

/// Marks `span` as failed with `message`.
pub fn set_error(span: &tracing::Span, message: &str) {
    span.set_status(opentelemetry::trace::Status::error(message.to_string()));
}

/// Sets an attribute on `span`'s OpenTelemetry span.
pub fn set_attribute(span: &tracing::Span, kv: KeyValue) {
    span.set_attribute(kv.key, kv.value);
}

/// A `Resource` naming `service`.
fn resource(service: &str) -> Resource {
    Resource::builder()
        .with_service_name(service.to_string())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_without_an_endpoint() {
        assert!(Export::resolve("", "", 1.0, "tiergate", env(&[]))
            .unwrap()
            .is_none());
    }

    #[test]
    fn config_wins_and_http_appends_the_signal_path() {
        let e = Export::resolve(
            "http://127.0.0.1:4318/",
            "",
            0.5,
            "tiergate",
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(e.protocol, Protocol::HttpProtobuf);
        assert_eq!(e.service_name, "tiergate");
        assert_eq!(e.sample_ratio, 0.5);
    }

    #[test]
    fn standard_variables_are_honoured() {
        let e = Export::resolve(
            "",
            "",
            1.0,
            "tiergate",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "router-eu"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.url, "http://collector:4317");
        assert_eq!(e.protocol, Protocol::Grpc);
        assert_eq!(e.service_name, "router-eu");
        let e = Export::resolve(
            "",
            "",
            1.0,
            "tiergate",
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            e.url, "http://c:4318/custom",
            "the signal's own URL is used as is"
        );
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let e = |ep: &str, p: &str, r: f64| {
            Export::resolve(ep, p, r, "t", env(&[]))
                .unwrap_err()
                .to_string()
        };
        assert!(e("http://c:4318", "http/json", 1.0).contains("not supported"));
        assert!(e("collector:4318", "", 1.0).contains("http://"));
        assert!(e("http://c:4318", "", 1.5).contains("[0, 1]"));
    }
}
