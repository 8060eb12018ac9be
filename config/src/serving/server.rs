//! `[server]`: the HTTP front end (listeners, limits, recording, tracing export).

use super::*;

/// HTTP front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Largest request head (start line and headers), in bytes; beyond, 431 in the OpenAI error shape (up to
    /// 1 MiB; past that the HTTP layer refuses with a bare 431).
    pub max_header_bytes: usize,
    /// Time allowed to receive a request's headers, in milliseconds (a slow client is cut off).
    pub header_timeout_ms: u64,
    /// Time allowed to receive a whole request body, in milliseconds (a total deadline, not per read).
    pub body_timeout_ms: u64,
    /// Requests handled at once by the whole server; beyond this, 429 with `Retry-After` (one admission point).
    pub max_in_flight: usize,
    /// Address of the admin listener (`/admin/*`, `/info`); loopback by default, never on the public
    /// listener, so a proxy in front of `listen` cannot reach it.
    pub admin_listen: SocketAddr,
    /// Bearer token for the admin listener (and for honouring `x-tiergate-threshold`). Without one, admin
    /// requests are accepted from loopback peers only, and the server warns at start.
    pub admin_token: Option<String>,
    /// Open connections at most on the public listener; beyond, new connections are closed at once.
    pub max_connections: usize,
    /// Open connections at most per client IP address.
    pub max_connections_per_peer: usize,
    /// After SIGTERM: how long the server keeps serving (with `Connection: close`, `/ready` already 503) so
    /// that load balancers stop sending, before it stops accepting, in milliseconds.
    pub lame_duck_ms: u64,
    /// When the LLM side is full, down or late: `degrade` answers with Tier-0 (flagged), `reject` returns 503.
    pub on_escalation_failure: FailureMode,
    /// Time given to in-flight requests at shutdown, in milliseconds.
    pub drain_ms: u64,
    /// Where traces are exported (OTLP), e.g. `http://127.0.0.1:4318` (HTTP: `/v1/traces` is appended) or
    /// `http://127.0.0.1:4317` (gRPC). Empty: the standard `OTEL_EXPORTER_OTLP_ENDPOINT` when set, else off.
    pub otlp_endpoint: String,
    /// `http/protobuf` or `grpc`. Empty: `OTEL_EXPORTER_OTLP_PROTOCOL` when set, else `http/protobuf`.
    pub otlp_protocol: OtlpProtocol,
    /// Share of new traces recorded, in [0, 1] (a request's own `traceparent` decides for its trace).
    pub trace_sample_ratio: f64,
    /// A JSON-lines file that receives every rerank the LLM answered (query text, Tier-0's and the fused
    /// distribution) for `tiergate distill`. Empty: off (users' text is written nowhere).
    #[serde(with = "empty_is_none")]
    pub record_escalations: Option<std::path::PathBuf>,
    /// Size of the record file before it rotates to `FILE.1`, bytes.
    pub record_max_bytes: u64,
    /// Keep the request's text in its decision record (`[feedback]`); off by default: records hold the
    /// decision, not what users wrote (audited requests keep theirs until labelled).
    pub record_text: bool,
    /// Also record each label Tier-0 answers alone and sure (not escalated, not degraded, not out of scope)
    /// in `record_escalations`, as `"source": "tier0"`: pseudo-labels for `tiergate distill` (off by default).
    pub record_tier0: bool,
    /// A streamed request whose answer has not started within this many milliseconds (a long prompt's
    /// prefill) gets its response head then, and keep-alive events until the answer comes, so an agent's idle
    /// timeout does not fire and retry the whole prompt; its `x-tiergate-*` outcome headers are then not sent
    /// (they are known only once a backend answers).
    pub stream_head_ms: u64,
    /// Time without an event after which a stream sends a keep-alive (an SSE comment; Anthropic's door: a
    /// `ping` event), in milliseconds.
    pub keepalive_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 4 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_in_flight: 512,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin_token: None,
            max_connections: 4096,
            max_connections_per_peer: 256,
            lame_duck_ms: 2_000,
            on_escalation_failure: FailureMode::Degrade,
            drain_ms: 10_000,
            otlp_endpoint: String::new(),
            otlp_protocol: OtlpProtocol::Unset,
            trace_sample_ratio: 1.0,
            record_escalations: None,
            record_max_bytes: 64 << 20,
            record_text: false,
            record_tier0: false,
            stream_head_ms: 5_000,
            keepalive_ms: 15_000,
        }
    }
}

impl ServerConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    "must be at least 1",
                ))
            } else {
                Ok(())
            }
        };
        positive("max_body_bytes", self.max_body_bytes as u64)?;
        positive("header_timeout_ms", self.header_timeout_ms)?;
        if !(1024..=1 << 20).contains(&self.max_header_bytes) {
            return Err(ConfigError::invalid(
                format!("{at}.max_header_bytes"),
                "must be in 1024..=1048576",
            ));
        }
        positive("body_timeout_ms", self.body_timeout_ms)?;
        positive("stream_head_ms", self.stream_head_ms)?;
        positive("keepalive_ms", self.keepalive_ms)?;
        positive("max_in_flight", self.max_in_flight as u64)?;
        positive("max_connections", self.max_connections as u64)?;
        positive(
            "max_connections_per_peer",
            self.max_connections_per_peer as u64,
        )?;
        positive("drain_ms", self.drain_ms)?;
        positive("record_max_bytes", self.record_max_bytes)?;
        if self.max_connections_per_peer > self.max_connections {
            return Err(ConfigError::invalid(
                format!("{at}.max_connections_per_peer"),
                "must not exceed max_connections",
            ));
        }
        if let Some(t) = &self.admin_token {
            if t.trim().len() < 8 || t.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    format!("{at}.admin_token"),
                    "must be at least 8 characters without spaces (or unset: loopback-only admin)",
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return Err(ConfigError::invalid(
                format!("{at}.trace_sample_ratio"),
                "must be in [0, 1]",
            ));
        }
        if self.admin_listen == self.listen && self.listen.port() != 0 {
            return Err(ConfigError::invalid(
                format!("{at}.admin_listen"),
                "must differ from listen: admin is never served on the public listener",
            ));
        }
        Ok(())
    }
}

/// What to do when escalation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Answer with Tier-0 and `x-tiergate-degraded`.
    Degrade,
    /// Return 503.
    Reject,
}

/// The OTLP export protocol (`server.otlp_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// Not set: `OTEL_EXPORTER_OTLP_PROTOCOL` when set, else `http/protobuf`.
    #[default]
    #[serde(rename = "")]
    Unset,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The config value (empty when unset).
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Unset => "",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// `""` in the TOML for "none": an optional path that reads and writes as a plain string.
mod empty_is_none {
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(
            &p.as_deref()
                .map(|p| p.to_string_lossy())
                .unwrap_or_default(),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        let s = String::deserialize(d)?;
        Ok((!s.is_empty()).then(|| PathBuf::from(s)))
    }
}
