//! Command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};

use crate::parse_duration;
use crate::schedule::ScheduleSpec;

/// Load-test an OpenAI-compatible chat endpoint and report each tiergate channel (Tier-0, escalated,
/// degraded, errors) separately.
#[derive(Debug, Clone, Parser)]
#[command(name = "tiergate-bench", version)]
#[command(group(ArgGroup::new("load").required(true).args(["rate", "concurrency", "tenants"])))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    /// A tool instead of a load test.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Base URL of the server, e.g. http://127.0.0.1:8080.
    #[arg(long, required = true, default_value = "")]
    pub url: String,

    /// Workload: CSV (text[,label[,route]], header optional) or JSONL ({"text", "label"?, "route"?}).
    /// Without it, synthetic unlabelled requests.
    #[arg(long)]
    pub data: Option<PathBuf>,

    /// Route (`model`) to call; default: the first classify route the server lists in /v1/models.
    #[arg(long)]
    pub route: Option<String>,

    /// Open loop: requests per second (the schedule's base rate).
    #[arg(long)]
    pub rate: Option<f64>,

    /// A tenant's workload, run at the same time as the other tenants' (open loop, each with its own report):
    /// `name=NAME,rate=R[,key_env=VAR|key=KEY][,data=FILE][,route=ROUTE]` (the API key from the environment
    /// variable VAR, or given; the workload and route default to --data and --route). Repeat per tenant.
    #[arg(long = "tenant", value_parser = parse_tenant, conflicts_with_all = ["rate", "concurrency", "compare"])]
    pub tenants: Vec<TenantMix>,

    /// Each request's budget, sent as `x-tiergate-deadline-ms`: `N` milliseconds, or `A-B` drawn uniformly; the
    /// report adds the share answered within budget, per channel and per budget range.
    #[arg(long = "deadline-ms")]
    pub deadline: Option<crate::deadlines::DeadlineSpec>,

    /// Open loop: exponential inter-arrival times (Poisson process) instead of constant spacing.
    #[arg(long, requires = "rate")]
    pub poisson: bool,

    /// Closed loop: this many clients, each sending its next request when the previous one ends.
    #[arg(long)]
    pub concurrency: Option<usize>,

    /// How long to send (default 60s unless --requests is given).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// How many requests to send (stops at whichever of --duration and --requests comes first).
    #[arg(long)]
    pub requests: Option<u64>,

    /// Arrival-rate schedule (open loop only): `constant`, `ramp[:from=R0]` (R0 → --rate over the run), or
    /// `surge[:at=20s,for=20s,x=3]` (base → ×x for a while → base; default the middle third, ×3).
    #[arg(long, default_value = "constant")]
    pub schedule: ScheduleSpec,

    /// Ask for server-sent events and measure time to first token.
    #[arg(long)]
    pub stream: bool,

    /// The API dialect to load-test: `chat` (OpenAI Chat Completions), `responses` (OpenAI Responses) or
    /// `messages` (Anthropic Messages, the key sent as `x-api-key`); bands, TTFT and errors per channel the
    /// same for each.
    #[arg(long, value_enum, default_value_t = crate::http::Api::Chat)]
    pub api: crate::http::Api,

    /// Seed for workload sampling and Poisson arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Write the full report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Write a self-contained HTML report with charts.
    #[arg(long)]
    pub html: Option<PathBuf>,

    /// Run the workload under four policies (Tier-0 only, LLM only, hybrid static, hybrid load) via
    /// /admin/routing, restoring the server's policy afterwards.
    #[arg(long)]
    pub compare: bool,

    /// SLO file (TOML, `[[slo]]` lines); default: the chat and batch SLOs.
    #[arg(long)]
    pub slo: Option<PathBuf>,

    /// Exit with status 2 when an SLO line fails.
    #[arg(long)]
    pub fail_on_slo: bool,

    /// Per-request timeout, counted from the intended send time.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Open loop: most requests outstanding at once; arrivals beyond it wait (their latency still counts
    /// from the intended time) and give up as `client_backlog` errors at --timeout.
    #[arg(long, default_value_t = 4096)]
    pub max_in_flight: usize,

    /// `max_tokens` for each request (generate routes).
    #[arg(long)]
    pub max_tokens: Option<u32>,

    /// Extra request header `Name: value` on every chat request, e.g. `x-tiergate-threshold: 0.5` to route
    /// this run with its own threshold (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,

    /// Bearer token for /admin/routing (scraping and --compare).
    #[arg(long, env = "TIERGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Base URL of the server's admin listener (`server.admin_listen`, e.g. http://127.0.0.1:8081), for
    /// scraping /admin/routing and --compare; default: --url.
    #[arg(long, env = "TIERGATE_ADMIN_URL")]
    pub admin_url: Option<String>,

    /// Bearer token for the chat endpoint.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// --compare: pause between variants, waiting for the server's LLM queue to drain (at most this long).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Client patience, for a latency experiment's report: the share of each variant's answers a user with
    /// this patience would have abandoned. `fixed:2s`, `uniform:1s..5s`, `exp:3s` (mean) or
    /// `lognormal:2s,0.6` (median, σ).
    #[arg(long)]
    pub patience: Option<crate::patience::Patience>,

    /// Price file (TOML: instance types with an hourly price, replicas and the channels they run): adds the
    /// cost per 1,000 requests per channel and blended, and the escalated share's cost (bench/costs/ has
    /// examples).
    #[arg(long)]
    pub cost: Option<PathBuf>,

    /// Labelled workloads: post feedback (`POST /v1/feedback` with the row's label) on this share of the
    /// answers, as a client that reports what it learned would.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub feedback: f64,

    /// Labelled workloads: label the server's pending audits (`/admin/audits`, admin listener) with the rows'
    /// labels every 2 s, as an operator would; the report follows Tier-0's silent error and the error bound.
    #[arg(long)]
    pub label_audits: bool,

    /// Drift: from the N-th request on, each query keeps a random half of its words (terser users).
    #[arg(long, value_name = "N")]
    pub drift_at: Option<u64>,

    /// Repetition profile: draw workload rows with Zipf exponent S (the r-th row of a seeded shuffle ∝ r^-S;
    /// repeated questions, as support traffic has) instead of uniformly.
    #[arg(long, value_name = "S")]
    pub zipf: Option<f64>,

    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// A share in [0, 1].
fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share in [0, 1]")),
    }
}

/// `Name: value` → (name, value), both checked as HTTP header parts.
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("--header `{s}`: expected `Name: value`"))?;
    let (name, value) = (name.trim(), value.trim());
    hyper::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("--header `{s}`: `{name}` is not a header name"))?;
    hyper::header::HeaderValue::from_str(value)
        .map_err(|_| format!("--header `{s}`: the value is not valid header text"))?;
    Ok((name.to_string(), value.to_string()))
}

/// One tenant's part of a multi-tenant run (`--tenant`).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantMix {
    pub name: String,
    pub rate: f64,
    pub key: Option<String>,
    pub data: Option<PathBuf>,
    pub route: Option<String>,
}

/// Parses `--tenant name=A,rate=R[,key_env=VAR|key=KEY][,data=FILE][,route=ROUTE]`.
pub fn parse_tenant(s: &str) -> Result<TenantMix, String> {
    let mut mix = TenantMix {
        name: String::new(),
        rate: 0.0,
        key: None,
        data: None,
        route: None,
    };
    for part in s.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("--tenant `{s}`: `{part}` is not key=value"))?;
        match k.trim() {
            "name" => mix.name = v.trim().to_string(),
            "rate" => {
                mix.rate = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|r: &f64| r.is_finite() && *r > 0.0)
                    .ok_or_else(|| format!("--tenant `{s}`: rate must be a positive number"))?
            }
            "key" => mix.key = Some(v.to_string()),
            "key_env" => {
                mix.key = Some(std::env::var(v.trim()).map_err(|_| {
                    format!("--tenant `{s}`: the environment variable `{v}` is not set")
                })?)
            }
            "data" => mix.data = Some(PathBuf::from(v.trim())),
            "route" => mix.route = Some(v.trim().to_string()),
            other => {
                return Err(format!(
                "--tenant `{s}`: unknown field `{other}` (name, rate, key_env, key, data, route)"
            ))
            }
        }
    }
    if mix.name.is_empty() || mix.rate == 0.0 {
        return Err(format!("--tenant `{s}`: needs name= and rate="));
    }
    Ok(mix)
}

/// The bench's tools.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Service-level objectives.
    #[command(subcommand)]
    Slo(SloCommand),
}

/// `slo …`.
#[derive(Debug, Clone, Subcommand)]
pub enum SloCommand {
    /// From a business SLA (end-to-end P95) to the model's P95 budget, its latency band and an SLO file
    /// for --slo: budget = (SLA − overhead) × (1 − margin).
    Derive(crate::derive::DeriveArgs),
}

impl Args {
    /// Check what clap cannot.
    pub fn check(&self) -> Result<(), String> {
        if let Some(r) = self.rate {
            if !r.is_finite() || r <= 0.0 {
                return Err(format!(
                    "--rate {r}: must be a positive number of requests per second"
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        if let Some(t) = self.tenants.iter().find(|t| !names.insert(&t.name)) {
            return Err(format!("--tenant: `{}` is named twice", t.name));
        }
        if self.concurrency == Some(0) {
            return Err("--concurrency must be at least 1".into());
        }
        if self.requests == Some(0) {
            return Err("--requests must be at least 1".into());
        }
        if self.max_in_flight == 0 {
            return Err("--max-in-flight must be at least 1".into());
        }
        if self.concurrency.is_some() && !matches!(self.schedule, ScheduleSpec::Constant) {
            return Err(
                "--schedule shapes an arrival rate: use it with --rate, not --concurrency".into(),
            );
        }
        if !matches!(self.schedule, ScheduleSpec::Constant) && self.duration.is_none() {
            return Err(
                "--schedule ramp/surge needs --duration (the shape is laid over it)".into(),
            );
        }
        if let Some(a) = &self.admin_url {
            if !a.starts_with("http://") {
                return Err(format!("--admin-url {a}: only http:// URLs are supported"));
            }
        }
        if !(self.url.starts_with("http://")) {
            return Err(format!(
                "--url {}: expected http://HOST:PORT (TLS is not supported; put the bench next to the server)",
                self.url
            ));
        }
        Ok(())
    }

    /// The send window (60 s unless only --requests bounds the run).
    pub fn window(&self) -> Option<Duration> {
        match (self.duration, self.requests) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(Duration::from_secs(60)),
        }
    }
}
