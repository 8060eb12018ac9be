//! Operations endpoints: `/v1/models`, `/metrics`, `/health`, `/ready`, `/info`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tiergate_config::RouteKind;

use tiergate_engine::metrics as m;
use tiergate_engine::state::AppState;

/// `GET /v1/models`: the routes.
pub async fn models(
    State(state): State<Arc<AppState>>,
    tenant: Option<axum::Extension<tiergate_engine::tenancy::tenants::TenantId>>,
) -> Response {
    let tenant = tenant.map_or_else(
        tiergate_engine::tenancy::tenants::TenantId::anonymous,
        |t| t.0,
    );
    // When the routes were loaded (the server's start), as Unix seconds.
    let created = tiergate_engine::load::utilization::unix_now_s()
        .saturating_sub(state.started.elapsed().as_secs());
    let data: Vec<_> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .filter(|r| state.tenants().permit(&tenant, &r.name).is_ok())
        .map(|r| {
            let kind = match r.kind {
                RouteKind::Classify => "classify",
                RouteKind::Answer => "answer",
                RouteKind::Generate => "generate",
            };
            json!({"id": r.name, "object": "model", "created": created, "owned_by": "tiergate",
                   "tiergate_kind": kind, "tiergate_aliases": r.aliases, "tiergate_default": r.default,
                   "tiergate_max_tokens": r.max_tokens, "tiergate_max_text_chars": r.max_text_chars})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    refresh_gauges(&state);
    match &state.metrics {
        Some(h) => ([("content-type", "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are disabled").into_response(),
    }
}

/// Updates the gauges that are sampled rather than counted.
pub fn refresh_gauges(state: &AppState) {
    let view = state.routing.policy.live_view(Instant::now());
    metrics::gauge!(m::THETA_EFF).set(view.theta_eff);
    metrics::gauge!(m::UTILIZATION).set(view.utilization);
    metrics::gauge!(m::ESCALATION_SHARE).set(view.escalated_share_60s);
    let policy = state.routing.policy.current();
    metrics::gauge!(m::POLICY_VERSION).set(policy.version as f64);
    let now = Instant::now();
    for rp in state.route_policies() {
        let labels = [
            ("route", rp.route.clone()),
            ("stage", rp.stage.clone().unwrap_or_default()),
        ];
        let live = rp.policy.live_view(now);
        metrics::gauge!(m::ROUTE_THETA_EFF, &labels).set(live.theta_eff);
        metrics::gauge!(m::ROUTE_UTILIZATION, &labels).set(live.utilization);
    }
    if let Some(ledger) = &state.evidence.ledger {
        ledger_gauges(state, &ledger.summary());
    }
    for (name, route) in state
        .routing
        .routes
        .iter()
        .filter(|(_, r)| r.prefilter.is_some())
    {
        let view = route.risk.view(&policy.cfg);
        let broken = view.as_ref().is_some_and(|v| v.theta_audits.is_some());
        metrics::gauge!(m::RISK_AUDIT_BREACH, "route" => name.clone())
            .set(f64::from(u8::from(broken)));
        if let Some(v) = view {
            metrics::gauge!(m::RISK_THETA, "route" => name.clone()).set(v.theta);
            metrics::gauge!(m::RISK_CALIBRATION_FLAWED, "route" => name.clone())
                .set(f64::from(u8::from(v.calibration_flaw.is_some())));
            metrics::gauge!(m::RISK_UPPER_BOUND, "route" => name.clone()).set(v.upper_bound);
        }
    }
    for (_, llm) in state.llms() {
        metrics::gauge!(m::QUEUE_DEPTH, "backend" => llm.name.clone())
            .set(llm.client.in_flight() as f64);
        metrics::gauge!(m::QUEUE_WAITING, "backend" => llm.name.clone()).set(llm.waiting() as f64);
        metrics::counter!(m::WORKER_RESTARTS, "backend" => llm.name.clone()).absolute(
            llm.supervisor
                .stats
                .restarts
                .load(std::sync::atomic::Ordering::Relaxed),
        );
    }
}

/// `GET /health`: the process is up.
pub async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /ready`: prefilters loaded (they are, once serving), not draining, and every generate route's first
/// stage with a live worker on one of its backends (a classify route degrades to Tier-0 without one).
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let unserved = state.unserved();
    let live = state.live_workers();
    let draining = state.draining.load(std::sync::atomic::Ordering::Acquire);
    let ok = !draining && unserved.is_empty();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({
            "ready": ok,
            "draining": draining,
            // A replica without its shared store keeps serving its last policy (still ready), and says so.
            "policy_store": state.routing.store.as_ref().map(|s| if s.is_up() { "reachable" } else { "unreachable: serving the last policy" }),
            "prefilter": true,
            "live_workers": live,
            "unserved_routes": unserved,
            "backends": state.llms().map(|(_, l)| json!({"name": l.name, "live_workers": l.client.live_workers()})).collect::<Vec<_>>(),
        })),
    )
        .into_response()
}

/// `GET /info`: the effective config, secrets redacted.
pub async fn info(
    State(state): State<Arc<AppState>>,
    crate::auth::Peer(peer): crate::auth::Peer,
    headers: axum::http::HeaderMap,
) -> Response {
    // The effective config names paths and worker arguments: admin credentials, as for /admin/routing.
    if let Err(e) = crate::auth::authorize_admin(state.admin_token(), &headers, peer) {
        return e.into_response();
    }
    let cfg = tiergate_config::redact::redacted(&state.config);
    let fusion: serde_json::Map<String, serde_json::Value> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .filter(|r| r.prefilter.is_some())
        .map(|r| {
            (
                r.name.clone(),
                serde_json::to_value(&r.fusion).unwrap_or_default(),
            )
        })
        .collect();
    let stages: serde_json::Map<String, serde_json::Value> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .map(|r| {
            let names: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
            (r.name.clone(), json!(names))
        })
        .collect();
    // Each stage's fusion per alternative backend (where its values come from: a fit or the config).
    let stage_fusion: serde_json::Map<String, serde_json::Value> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .filter(|r| r.prefilter.is_some())
        .map(|r| {
            let per_stage: Vec<serde_json::Value> = r
                .stages
                .iter()
                .map(|s| {
                    let by: serde_json::Map<String, serde_json::Value> = s
                        .alternatives
                        .iter()
                        .zip(&s.fusions)
                        .map(|((_, n), f)| (n.clone(), serde_json::to_value(f).unwrap_or_default()))
                        .collect();
                    json!(by)
                })
                .collect();
            (r.name.clone(), json!(per_stage))
        })
        .collect();
    // Each classified route's head in force (a live swap's, with its folder) and the one in shadow.
    let heads: serde_json::Map<String, serde_json::Value> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .filter(|r| r.prefilter.is_some())
        .map(|r| {
            let shadow = state.routing.heads.shadow_of(&r.name).map(|s| s.candidate.head_version.clone());
            (r.name.clone(), json!({"version": r.head_version, "dir": state.routing.heads.dir_of(&r.name), "shadow": shadow}))
        })
        .collect();
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION"), "config": cfg, "live_workers": state.live_workers(),
                      "heads": heads,
                      "segment": state.default_llm().map(|l| l.segment.clone()),
                      "segments": state.llms().map(|(_, l)| l.segment.clone()).collect::<Vec<_>>(), "fusion": fusion,
                      "backends": state.backends.iter().map(|b| &b.name).collect::<Vec<_>>(), "stages": stages,
                      "stage_fusion": stage_fusion}))
        .into_response()
}

/// The ledger's gauges, of each route's head in force: silent error with its interval, audits, feedback
/// accuracy (trusted feedback).
fn ledger_gauges(state: &AppState, s: &tiergate_engine::evidence::ledger::Summary) {
    for (route, r) in &s.routes {
        let head = state
            .routing
            .routes
            .get(route)
            .map(|x| x.head_version.clone());
        let head = head.as_deref();
        metrics::gauge!(m::AUDITS, "route" => route.clone(), "state" => "pending")
            .set(r.pending_of(head) as f64);
        metrics::gauge!(m::AUDITS, "route" => route.clone(), "state" => "labelled").set(
            r.audits(head, tiergate_engine::evidence::ledger::summary::TIER0)
                .n as f64,
        );
        if let Some(e) = r.silent_error(head) {
            for (bound, v) in [
                ("estimate", e.estimate),
                ("lower", e.lower),
                ("upper", e.upper),
            ] {
                metrics::gauge!(m::SILENT_ERROR, "route" => route.clone(), "bound" => bound).set(v);
            }
        }
        for (channel, c) in &r.feedback {
            if let Some(a) = c.accuracy() {
                metrics::gauge!(m::FEEDBACK_ACCURACY, "route" => route.clone(), "channel" => channel.clone()).set(a);
            }
        }
    }
}
