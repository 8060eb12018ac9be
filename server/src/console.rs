//! `/console`: an operator's page embedded in the binary (no CDN, no build step), served on the admin
//! listener, and the data it polls (`GET /admin/console`): the live policy view, the ambiguity histogram of the
//! last 60 s, per-channel P95 of recent answers, and the last decisions (no request text is kept).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};
use serde::Serialize;
use serde_json::json;

use crate::app::AppState;
use crate::outcome::Outcome;
use crate::routes::admin::Peer;

/// The page.
const PAGE: &str = include_str!("console.html");
/// Decisions kept for the page.
const KEEP: usize = 200;
/// Histogram bins over ambiguity [0, 1].
const BINS: usize = 40;

/// One answered request, as the console lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Unix time, milliseconds.
    pub t_ms: u64,
    /// The route (`model`).
    pub route: String,
    /// Ambiguity 1 − max p (classified routes).
    pub a: Option<f64>,
    /// θ the decision used.
    pub theta: Option<f64>,
    /// `tier0`, `escalated` or `degraded`.
    pub channel: &'static str,
    /// The label answered (classified routes).
    pub label: Option<String>,
    /// End-to-end latency, milliseconds.
    pub latency_ms: f64,
    #[serde(skip)]
    at: Option<Instant>,
}

/// Records an answered request's outcome.
pub fn record(state: &AppState, route: &str, outcome: &Outcome, took: Duration) {
    let d = Decision {
        t_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        route: route.to_string(),
        a: outcome.confidence.map(|c| 1.0 - f64::from(c)),
        theta: outcome.threshold,
        channel: outcome.channel().as_str(),
        label: outcome.label.clone(),
        latency_ms: took.as_secs_f64() * 1e3,
        at: Some(Instant::now()),
    };
    if let Ok(mut q) = state.decisions.lock() {
        q.push_back(d);
        while q.len() > KEEP {
            q.pop_front();
        }
    }
}

/// `GET /console`: the page (its data requests carry the admin credentials).
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// `GET /admin/console`: what the page shows.
pub async fn data(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = crate::auth::authorize_admin(&state, &headers, peer) {
        return e.into_response();
    }
    let now = Instant::now();
    let mut bins = vec![0u32; BINS];
    for a in state.policy.recent_ambiguity(now) {
        let i = ((a.clamp(0.0, 1.0) * BINS as f64) as usize).min(BINS - 1);
        bins[i] += 1;
    }
    let recent: Vec<Decision> = state
        .decisions
        .lock()
        .map(|q| q.iter().cloned().collect())
        .unwrap_or_default();
    let p95 = |channel: &str| {
        let v: Vec<f64> = recent
            .iter()
            .filter(|d| {
                d.channel == channel
                    && d.at
                        .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
            })
            .map(|d| d.latency_ms)
            .collect();
        crate::policy::quantile(v, 0.95)
    };
    let live = state.policy.live_view(now);
    let current = state.policy.current();
    let degraded = recent.iter().filter(|d| d.channel == "degraded").count() as f64
        / recent.len().max(1) as f64;
    axum::Json(json!({
        "version": current.version,
        "policy": current.cfg,
        "theta_eff": live.theta_eff,
        "utilization": live.utilization,
        "utilization_in_use": live.utilization_in_use,
        "escalated_share_60s": live.escalated_share_60s,
        "degraded_share_recent": degraded,
        "queue_depth": state.llm.as_ref().map_or(0, |l| l.client.in_flight()),
        "p95_ms": {"tier0": p95("tier0"), "escalated": p95("escalated"), "degraded": p95("degraded")},
        "bands_ms": tiergate_core::bands::BANDS
            .iter()
            .map(|(_, key, max)| (key.to_string(), json!(max)))
            .collect::<serde_json::Map<_, _>>(),
        "ambiguity_histogram": bins,
        "decisions": recent.iter().rev().take(50).collect::<Vec<_>>(),
        "token_required": state.config.server.admin_token.is_some(),
    }))
    .into_response()
}
