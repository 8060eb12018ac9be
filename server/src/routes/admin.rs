//! `/admin/routing`: read and change the routing policy live (validated, versioned, audited).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tiergate_config::{RoutingConfig, RoutingPatch};

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::state::AppState;

/// Which policy an `/admin/routing` request is about: the routing policy, a steered generate route's
/// (`?route=R`) or a cascade stage's (`?route=R&stage=S`, the stage's name).
fn target(
    state: &AppState,
    q: &std::collections::HashMap<String, String>,
) -> Result<Option<Arc<tiergate_engine::routing::policy::Policy>>, ApiError> {
    match (q.get("route"), q.get("stage")) {
        (None, None) => Ok(None),
        (Some(r), stage) => state
            .route_policy(r, stage.map(String::as_str))
            .map(Some)
            .ok_or_else(|| {
                ApiError::NotFound(match stage {
                    Some(st) => format!(
                        "route `{r}` has no stage `{st}` after its first (stages after the first have a policy)"
                    ),
                    None => format!(
                        "route `{r}` has no policy of its own (a steered generate route has; name a `stage` for a cascade stage's)"
                    ),
                })
            }),
        (None, Some(_)) => Err(ApiError::invalid(
            "stage",
            "a stage's policy needs its `route` too",
        )),
    }
}

fn view(state: &AppState, stage: Option<&tiergate_engine::routing::policy::Policy>) -> Value {
    let policy = stage.unwrap_or(&state.routing.policy);
    let p = policy.current();
    let live = policy.live_view(Instant::now());
    let mut v = serde_json::to_value(&p.cfg).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("theta_eff".into(), json!(live.theta_eff));
        o.insert("utilization".into(), json!(live.utilization));
        o.insert("utilization_in_use".into(), json!(live.utilization_in_use));
        o.insert(
            "escalated_share_10s".into(),
            json!(live.escalated_share_10s),
        );
        o.insert(
            "escalated_share_60s".into(),
            json!(live.escalated_share_60s),
        );
        o.insert("queue_depth".into(), json!(state.in_flight()));
        o.insert("version".into(), json!(p.version));
        if stage.is_none() && p.cfg.max_error.is_some() {
            o.insert("risk".into(), risk_view(state, &p.cfg, live.theta_eff));
        }
    }
    v
}

/// Per route, the error bound's θ, its evidence, and the θ in force once the bound caps the policy's.
fn risk_view(state: &AppState, cfg: &tiergate_config::RoutingConfig, theta_eff: f64) -> Value {
    state
        .routing
        .routes
        .iter()
        .filter(|(_, r)| r.prefilter.is_some())
        .filter_map(|(name, r)| {
            let v = r.risk.view(cfg)?;
            let mut j = serde_json::to_value(&v).ok()?;
            // Below the grid's first θ the fixed-sequence proof says nothing: flagged, not capped.
            let (in_force, outside) = v.in_force(theta_eff);
            j["theta_eff"] = json!(in_force);
            j["outside_proof"] = json!(outside);
            Some((name.clone(), j))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A change of `policy` (stored in the hash `key`) through the shared store: compare-and-set on the version
/// there (the audit line goes to the shared log in the same step); on a conflict this replica installs the
/// stored version and reports it. Redis unreachable: 503, the policy in force stays; a policy there written in
/// a newer format: 409 (this replica would drop what it does not know).
async fn store_change(
    policy: &tiergate_engine::routing::policy::Policy,
    store: &tiergate_engine::routing::store::RedisStore,
    key: &str,
    expected: u64,
    cfg: RoutingConfig,
    audit: Value,
) -> Result<Result<(u64, u64), u64>, ApiError> {
    use tiergate_engine::routing::store::{Cas, Stored};
    let unreachable = |e: redis::RedisError| {
        ApiError::Unavailable(format!("the shared policy store is unreachable: {e}"))
    };
    match store
        .compare_and_set(key, expected, &cfg, &audit.to_string())
        .await
        .map_err(unreachable)?
    {
        Cas::Stored(v) => {
            policy.install(cfg, v, false);
            Ok(Ok((expected, v)))
        }
        Cas::Conflict(v) => {
            if let Stored::Policy(stored, version) = store.fetch(key).await.map_err(unreachable)? {
                policy.install(stored, version, false);
            }
            Ok(Err(v))
        }
        Cas::Newer(f) => Err(ApiError::Conflict(format!(
            "the shared policy was written in format {f} by a newer replica; this one writes format {} \
             and would drop what it does not know: change it through an upgraded replica",
            tiergate_engine::routing::store::FORMAT
        ))),
    }
}

/// `base` with `patch` applied, or a 400 naming what is wrong (serde's message names an unknown field and the
/// fields there are).
fn merged_policy(base: &RoutingConfig, patch: &RoutingPatch) -> Result<RoutingConfig, ApiError> {
    patch.apply(base).map_err(invalid_policy)
}

fn invalid_policy(e: tiergate_config::ConfigError) -> ApiError {
    let param = match &e {
        tiergate_config::ConfigError::Invalid { field, .. } => {
            Some(field.trim_start_matches("routing.").to_string())
        }
        tiergate_config::ConfigError::Parse { message, .. } => message
            .split('`')
            .nth(1)
            .filter(|_| message.starts_with("unknown field"))
            .map(str::to_string),
        _ => None,
    };
    ApiError::Invalid {
        message: format!("invalid policy: {e}"),
        param,
    }
}

fn with_etag(
    state: &AppState,
    stage: Option<&tiergate_engine::routing::policy::Policy>,
    body: Value,
) -> Response {
    let mut resp = axum::Json(body).into_response();
    let version = stage.unwrap_or(&state.routing.policy).current().version;
    if let Ok(v) = format!("\"{version}\"").parse() {
        resp.headers_mut().insert("etag", v);
    }
    resp
}

/// The query of `/admin/routing` (`route` and `stage` for a cascade stage's policy).
type RoutingQuery = axum::extract::Query<std::collections::HashMap<String, String>>;

/// `GET /admin/routing` (`?route=&stage=`: a cascade stage's policy).
pub async fn get_routing(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
) -> Response {
    let run = || {
        authorize_admin(state.admin_token(), &headers, peer)?;
        let stage = target(&state, &q)?;
        let stage = stage.as_deref();
        Ok::<_, ApiError>(with_etag(&state, stage, view(&state, stage)))
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `PATCH /admin/routing`: any subset of the policy fields.
pub async fn patch_routing(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    change(&state, peer, &headers, &q, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `PUT /admin/routing`: all of the policy fields.
pub async fn put_routing(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    change(&state, peer, &headers, &q, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn change(
    state: &AppState,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    q: &std::collections::HashMap<String, String>,
    body: Value,
    full: bool,
) -> Result<Response, ApiError> {
    authorize_admin(state.admin_token(), headers, peer)?;
    let stage = target(state, q)?;
    let stage = stage.as_deref();
    let patch = RoutingPatch::parse(body).map_err(invalid_policy)?;
    if full {
        if let Some(missing) = patch.missing() {
            return Err(ApiError::invalid(
                missing.clone(),
                format!(
                    "PUT needs every policy field; `{missing}` is missing (use PATCH for a subset)"
                ),
            ));
        }
    }
    let if_match = match headers.get("if-match").map(|v| {
        v.to_str()
            .map(|s| s.trim().trim_matches('"').parse::<u64>())
    }) {
        None => None,
        Some(Ok(Ok(v))) => Some(v),
        Some(_) => {
            return Err(ApiError::invalid(
                "If-Match",
                "must be the policy version number",
            ))
        }
    };
    // Optimistic concurrency: merge onto the version read, replace only if it is still current, and merge
    // again onto a concurrent writer's version (without If-Match) instead of losing its change.
    let change = patch.as_json().to_string();
    let policy = stage.unwrap_or(&state.routing.policy);
    let (from, to) = loop {
        let current = policy.current();
        let cfg = merged_policy(&current.cfg, &patch)?;
        if stage.is_some() {
            cfg.validate_stage("routing")
                .map_err(|e| ApiError::Invalid {
                    message: e.to_string(),
                    param: Some("max_error".into()),
                })?;
        }
        let expected = if_match.unwrap_or(current.version);
        let outcome = match &state.routing.store {
            Some(store) => {
                let key = match q.get("route") {
                    Some(r) => store.policy_key(r, q.get("stage").map(String::as_str)),
                    None => store.routing_key().to_string(),
                };
                let audit = json!({"from_version": expected, "peer": peer.map(|p| p.to_string()),
                    "change": change, "route": q.get("route"), "stage": q.get("stage")});
                store_change(policy, store, &key, expected, cfg, audit).await?
            }
            None => policy
                .replace(cfg, Some(expected))
                .map(|(old, new)| (old.version, new.version)),
        };
        match outcome {
            Ok(changed) => break changed,
            Err(_) if if_match.is_none() => continue,
            Err(v) => {
                return Err(ApiError::PreconditionFailed(format!(
                    "policy is at version {v}, not the If-Match version"
                )))
            }
        }
    };
    tracing::info!(
        target: "tiergate::audit",
        from_version = from,
        to_version = to,
        peer = ?peer,
        change = %change,
        route = q.get("route").map(String::as_str),
        stage = q.get("stage").map(String::as_str),
        "routing policy changed"
    );
    Ok(with_etag(state, stage, view(state, stage)))
}

/// `GET /admin/experiments`: the latency experiments in force.
pub async fn get_experiments(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(json!({"experiments": *state.routing.experiments.current()})).into_response()
}

/// `PUT /admin/experiments`: replaces the list (`{"experiments": [...]}`; an empty list stops them all),
/// validated as the config's `[[experiments]]` against this server's routes.
pub async fn put_experiments(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    let run = || -> Result<Response, ApiError> {
        authorize_admin(state.admin_token(), &headers, peer)?;
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            experiments: Vec<tiergate_config::ExperimentConfig>,
        }
        let b: Body = serde_json::from_value(body.clone())
            .map_err(|e| ApiError::invalid("experiments", e.to_string()))?;
        let routes: Vec<&str> = state
            .routing
            .route_order
            .iter()
            .map(String::as_str)
            .collect();
        tiergate_config::validate_experiments(&b.experiments, &routes, "experiments")
            .map_err(|e| ApiError::invalid("experiments", e.to_string()))?;
        tracing::info!(target: "tiergate::audit", peer = ?peer, experiments = %body, "latency experiments replaced");
        state.routing.experiments.replace(b.experiments);
        Ok(
            axum::Json(json!({"experiments": *state.routing.experiments.current()}))
                .into_response(),
        )
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /admin/tenants`: the tenants in force (names, routes, limits; never a key digest).
pub async fn get_tenants(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(json!({"tenants": state.tenants().describe()})).into_response()
}

/// `POST /admin/tenants/reload`: reads `[[tenants]]` and `tenants_file` again (as SIGHUP does); 400 naming
/// the problem when they do not load, the keys in force staying.
pub async fn reload_tenants(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer) {
        return e.into_response();
    }
    match state.reload_tenants() {
        Ok(n) => axum::Json(json!({"tenants": n})).into_response(),
        Err(e) => ApiError::Invalid {
            message: format!("tenants not reloaded (the keys in force stay): {e}"),
            param: Some("tenants_file".into()),
        }
        .into_response(),
    }
}
