//! `--compare`: the same workload under four routing policies, set live through /admin/routing, and the
//! server's own policy put back afterwards.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hyper::Method;
use serde::Serialize;
use serde_json::{json, Map, Value};
use tiergate_config::RoutingConfig;

use crate::http::HttpClient;
use crate::report::RunReport;
use crate::scrape::routing;
use crate::stats::ms;

/// A policy to run under.
#[derive(Debug, Clone)]
pub struct Variant {
    pub name: &'static str,
    pub patch: Value,
}

/// The server's policy fields from a GET /admin/routing view.
pub fn saved_policy(view: &Value) -> Result<Value, String> {
    let mut m = Map::new();
    // The policy fields /admin/routing accepts (what we save and restore).
    for f in RoutingConfig::fields() {
        let v = view.get(&f).ok_or_else(|| {
            format!("GET /admin/routing has no `{f}`: is this a tiergate server?")
        })?;
        m.insert(f, v.clone());
    }
    Ok(Value::Object(m))
}

/// Tier-0 only (θ = 1: never escalate), LLM only (θ = 0: escalate whenever Tier-0 is less than certain),
/// hybrid static (the server's θ_base), hybrid load (the server's θ_base + k·u). The reference for ratios
/// is the last one, tiergate's default mode.
pub fn variants(saved: &Value) -> Vec<Variant> {
    let base = saved["theta_base"].as_f64().unwrap_or(0.65);
    let (lo, hi) = (
        saved["theta_min"].as_f64().unwrap_or(0.0),
        saved["theta_max"].as_f64().unwrap_or(1.0),
    );
    vec![
        Variant {
            name: "tier0-only",
            patch: json!({"mode": "static", "theta_base": 1.0, "theta_min": 0.0, "theta_max": 1.0}),
        },
        Variant {
            name: "llm-only",
            patch: json!({"mode": "static", "theta_base": 0.0, "theta_min": 0.0, "theta_max": 1.0}),
        },
        Variant {
            name: "hybrid-static",
            patch: json!({"mode": "static", "theta_base": base, "theta_min": lo, "theta_max": hi}),
        },
        Variant {
            name: "hybrid-load",
            patch: json!({"mode": "load", "theta_base": base, "theta_min": lo, "theta_max": hi}),
        },
    ]
}

/// PATCH /admin/routing.
pub async fn patch(client: &HttpClient, token: Option<&str>, body: &Value) -> Result<(), String> {
    let (status, v) = client
        .json(Method::PATCH, "/admin/routing", token, Some(body))
        .await?;
    if status != 200 {
        return Err(format!(
            "PATCH /admin/routing → {status}: {}",
            v["error"]["message"].as_str().unwrap_or("")
        ));
    }
    Ok(())
}

/// Wait until the server's LLM queue is empty (the previous variant's escalations are done), at most `max`.
pub async fn drain(client: &HttpClient, token: Option<&str>, max: Duration) -> Duration {
    let t0 = Instant::now();
    while t0.elapsed() < max {
        match routing(client, token).await {
            Ok(v) if v["queue_depth"].as_f64().unwrap_or(0.0) <= 0.0 => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(_) => break,
        }
    }
    t0.elapsed()
}

/// One line of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub variant: String,
    pub requests: u64,
    pub served_per_s: f64,
    pub p99_served_ms: Option<f64>,
    pub p99_tier0_ms: Option<f64>,
    pub p99_escalated_ms: Option<f64>,
    pub p99_degraded_ms: Option<f64>,
    pub accuracy: Option<f64>,
    pub escalation_share: Option<f64>,
    pub errors: u64,
    /// Per 1,000 answered requests (with --cost).
    pub cost_per_1k: Option<f64>,
    /// Against hybrid-load.
    pub throughput_ratio: Option<f64>,
    pub p99_ratio: Option<f64>,
    pub accuracy_ratio: Option<f64>,
}

/// The comparison table's rows.
pub fn rows(runs: &[RunReport]) -> Vec<Row> {
    let p99 = |r: &RunReport, ch: &str| {
        r.channel(ch)
            .and_then(|c| c.latency.as_ref())
            .map(|l| l.p99_ms)
    };
    let mut rows: Vec<Row> = runs
        .iter()
        .map(|r| Row {
            variant: r.name.clone(),
            requests: r.requests,
            served_per_s: r.channel("served").map_or(0.0, |c| c.requests_per_s),
            p99_served_ms: p99(r, "served"),
            p99_tier0_ms: p99(r, "tier0"),
            p99_escalated_ms: p99(r, "escalated"),
            p99_degraded_ms: p99(r, "degraded"),
            accuracy: r.channel("served").and_then(|c| c.accuracy),
            escalation_share: r.escalation_share(),
            errors: r.channel("errors").map_or(0, |c| c.count),
            cost_per_1k: r.cost.as_ref().and_then(|c| c.blended_per_1k),
            throughput_ratio: None,
            p99_ratio: None,
            accuracy_ratio: None,
        })
        .collect();
    if let Some(reference) = rows.iter().find(|r| r.variant == "hybrid-load").cloned() {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        for r in &mut rows {
            r.throughput_ratio = ratio(Some(r.served_per_s), Some(reference.served_per_s));
            r.p99_ratio = ratio(r.p99_served_ms, reference.p99_served_ms);
            r.accuracy_ratio = ratio(r.accuracy, reference.accuracy);
        }
    }
    rows
}

/// The comparison as text.
pub fn render(rows: &[Row]) -> String {
    let mut s = String::from("\n== comparison (ratios against hybrid-load) ==\n");
    let _ = writeln!(
        s,
        "{:<14} {:>8} {:>9} {:>10} {:>10} {:>11} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>10}",
        "variant",
        "requests",
        "served/s",
        "p99 ms",
        "tier0 p99",
        "escal. p99",
        "degr. p99",
        "acc",
        "escal.",
        "errors",
        "×thrpt",
        "×p99",
        "×acc",
        "cost/1k"
    );
    let o = |x: Option<f64>| x.map_or("-".to_string(), ms);
    let r2 = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>9.1} {:>10} {:>10} {:>11} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>10}",
            r.variant,
            r.requests,
            r.served_per_s,
            o(r.p99_served_ms),
            o(r.p99_tier0_ms),
            o(r.p99_escalated_ms),
            o(r.p99_degraded_ms),
            r.accuracy.map_or("-".into(), |a| format!("{a:.3}")),
            r.escalation_share
                .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
            r.errors,
            r2(r.throughput_ratio),
            r2(r.p99_ratio),
            r2(r.accuracy_ratio),
            r.cost_per_1k.map_or("-".into(), |c| format!("{c:.4}")),
        );
    }
    s
}
