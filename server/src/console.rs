//! `/console`: an operator's page embedded in the binary (no CDN, no build step), served on the admin
//! listener, and the data it polls (`GET /admin/console`): the live policy view, the ambiguity histogram of the
//! last 60 s, per-channel P95 of recent answers, per-tenant figures, the backends, the last 15 minutes as time
//! series ([`tiergate_engine::load::history`]), the answer cache, and the last decisions (no request text is kept).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};
use serde_json::json;

use crate::auth::Peer;
use tiergate_engine::answer::outcome::{Channel, Decision};
use tiergate_engine::state::AppState;

/// The page.
const PAGE: &str = include_str!("console.html");
/// Histogram bins over ambiguity [0, 1].
const BINS: usize = 40;

/// `GET /console`: the page (its data requests carry the admin credentials).
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// Per tenant: its figures since start, the jobs it has waiting for the LLM, and its LLM budget left.
fn tenants(state: &AppState) -> Vec<serde_json::Value> {
    let configured = state.tenants();
    let now = Instant::now();
    state
        .tenancy
        .figures
        .snapshot()
        .into_iter()
        .map(|(name, c)| {
            let t = configured.named(&name);
            json!({
                "name": name,
                "counts": c,
                "waiting": state.waiting(&name),
                "weight": t.map_or(1.0, |t| t.weight),
                "llm_seconds_left": t
                    .and_then(|t| t.budget())
                    .and_then(|b| b.lock().ok().map(|mut b| b.left(now))),
            })
        })
        .collect()
}

/// Per LLM backend: its live workers, jobs running and waiting, recent P95 service time and breaker.
fn backends(state: &AppState) -> Vec<serde_json::Value> {
    state
        .backends
        .iter()
        .map(|b| match &b.llm {
            Some(l) => {
                let (running, waiting) = l.share.load();
                json!({
                    "name": b.name,
                    "live_workers": l.client.live_workers(),
                    "running": running,
                    "waiting": waiting,
                    "rerank_p95_ms": l
                        .rerank_times
                        .recent_p95(Duration::from_secs(60))
                        .map(|d| d.as_secs_f64() * 1e3),
                    "breaker": if l.breaker_closed() { "closed" } else { "open" },
                })
            }
            None => json!({"name": b.name, "live_workers": 0, "breaker": null}),
        })
        .collect()
}

/// `GET /admin/console`: what the page shows.
pub async fn data(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = crate::auth::authorize_admin(state.admin_token(), &headers, peer) {
        return e.into_response();
    }
    let now = Instant::now();
    let mut bins = vec![0u32; BINS];
    for a in state.routing.policy.recent_ambiguity(now) {
        let i = ((a.clamp(0.0, 1.0) * BINS as f64) as usize).min(BINS - 1);
        bins[i] += 1;
    }
    let recent: Vec<Decision> = state.load.decisions.recent();
    let live = state.routing.policy.live_view(now);
    let current = state.routing.policy.current();
    let degraded = recent
        .iter()
        .filter(|d| d.channel == Channel::Degraded.as_str())
        .count() as f64
        / recent.len().max(1) as f64;
    // θ in force once the error bound caps the policy's (the smallest over the routes it caps).
    let capped = state
        .routing
        .routes
        .values()
        .filter(|r| r.prefilter.is_some())
        .filter_map(|r| r.risk.theta(&current.cfg))
        .map(|b| tiergate_engine::routing::risk::cap(live.theta_eff, Some(b)))
        .reduce(f64::min);
    axum::Json(json!({
        "version": current.version,
        "policy": current.cfg,
        "theta_eff": capped.unwrap_or(live.theta_eff),
        "theta_policy": live.theta_eff,
        "theta_capped_by_bound": capped.is_some_and(|c| c < live.theta_eff),
        "utilization": live.utilization,
        "utilization_in_use": live.utilization_in_use,
        "escalated_share_60s": live.escalated_share_60s,
        "degraded_share_recent": degraded,
        "queue_depth": state.in_flight(),
        "p95_ms": tiergate_engine::load::history::p95_by_channel(&recent, now, Duration::from_secs(60)),
        "bands_ms": tiergate_core::bands::BANDS
            .iter()
            .map(|(_, key, max)| (key.to_string(), json!(max)))
            .collect::<serde_json::Map<_, _>>(),
        "ambiguity_histogram": bins,
        "decisions": recent.iter().rev().take(50).collect::<Vec<_>>(),
        "tenants": tenants(&state),
        "brownout": state.brownout().as_str(),
        "breaker": state.default_llm().is_some().then(|| if state.breakers_closed() { "closed" } else { "open" }),
        "backends": backends(&state),
        "history": state.load.history.points(),
        "stages": state.route_policies().into_iter().map(|rp| {
            let (live, p) = (rp.policy.live_view(now), rp.policy.current());
            json!({
                "route": rp.route, "stage": rp.stage, "theta_eff": live.theta_eff, "version": p.version,
                "mode": p.cfg.mode, "utilization": live.utilization,
                "escalated_share_60s": live.escalated_share_60s,
            })
        }).collect::<Vec<_>>(),
        "quality": quality(&state, live.theta_eff),
        "cache": cache(&state, &recent),
        "token_required": state.config.server.admin_token.is_some(),
    }))
    .into_response()
}

/// Per classified route: the ledger's figures (silent error, audits, feedback) and the error bound in force.
fn quality(state: &AppState, theta_eff: f64) -> Vec<serde_json::Value> {
    let summary = state
        .evidence
        .ledger
        .as_ref()
        .map(|l| l.summary())
        .unwrap_or_default();
    let cfg = state.routing.policy.current().cfg.clone();
    let agreement = state.agreement();
    state
        .routing
        .route_order
        .iter()
        .filter_map(|name| Some((name, state.routing.routes.get(name)?)))
        .filter(|(_, r)| r.prefilter.is_some())
        .map(|(name, r)| {
            let mut v = summary
                .routes
                .get(name)
                .cloned()
                .unwrap_or_default()
                .view(Some(&r.head_version));
            v["route"] = json!(name);
            let risk = r.risk.view(&cfg);
            v["risk"] = json!(risk);
            if let Some(b) = &risk {
                // Below the grid's first θ the bound's proof says nothing: flagged, not capped.
                v["risk"]["outside_proof"] = json!(b.in_force(theta_eff).1);
            }
            v["llm_agreement"] = agreement.get(name).map(|a| a.view()).into();
            v
        })
        .collect()
}

/// The answer cache (`null` when off): its size, and the share of the recent decisions it answered.
fn cache(state: &AppState, recent: &[Decision]) -> serde_json::Value {
    let Some(cache) = &state.cache else {
        return serde_json::Value::Null;
    };
    let (entries, bytes) = cache.size();
    let hits = recent
        .iter()
        .filter(|d| d.channel == Channel::Cache.as_str())
        .count();
    json!({
        "entries": entries, "bytes": bytes, "max_bytes": state.config.cache.max_bytes,
        "hits_recent": hits, "hit_share_recent": hits as f64 / recent.len().max(1) as f64,
        "shared_up": cache.shared_up(),
    })
}
