//! `/admin/routing`: read and change the routing policy live (validated, versioned, audited); the latency
//! experiments; the tenants.

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::{Engine, PolicyChange, PolicyTarget};

/// The query of `/admin/routing` (`route` and `stage` for a steered route's or a cascade stage's policy).
type RoutingQuery = axum::extract::Query<HashMap<String, String>>;

fn target(q: &HashMap<String, String>) -> PolicyTarget {
    PolicyTarget {
        route: q.get("route").cloned(),
        stage: q.get("stage").cloned(),
    }
}

/// A policy view with its version as the `ETag`.
fn with_etag((body, version): (Value, u64)) -> Response {
    let mut resp = axum::Json(body).into_response();
    if let Ok(v) = format!("\"{version}\"").parse() {
        resp.headers_mut().insert("etag", v);
    }
    resp
}

/// `GET /admin/routing` (`?route=&stage=`: a cascade stage's policy).
pub async fn get_routing(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
) -> Response {
    let run = || {
        authorize_admin(engine.admin_token(), &headers, peer)?;
        Ok::<_, ApiError>(with_etag(engine.policy(&target(&q))?))
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `PATCH /admin/routing`: any subset of the policy fields.
pub async fn patch_routing(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    change(&engine, peer, &headers, &q, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `PUT /admin/routing`: all of the policy fields.
pub async fn put_routing(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
    axum::extract::Query(q): RoutingQuery,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    change(&engine, peer, &headers, &q, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// A change through the engine ([`Engine::change_policy`]): the body a patch, `If-Match` the version it
/// must replace.
async fn change(
    engine: &Engine,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: Value,
    full: bool,
) -> Result<Response, ApiError> {
    authorize_admin(engine.admin_token(), headers, peer)?;
    let t = target(q);
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
    let c = PolicyChange {
        patch: body,
        full,
        if_match,
        peer: peer.map(|p| p.to_string()),
    };
    Ok(with_etag(engine.change_policy(&t, c).await?))
}

/// `GET /admin/experiments`: the latency experiments in force.
pub async fn get_experiments(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(engine.experiments()).into_response()
}

/// `PUT /admin/experiments`: replaces the list (`{"experiments": [...]}`; an empty list stops them all),
/// validated as the config's `[[experiments]]` against this server's routes.
pub async fn put_experiments(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    let run = || -> Result<Response, ApiError> {
        authorize_admin(engine.admin_token(), &headers, peer)?;
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            experiments: Vec<tiergate_config::ExperimentConfig>,
        }
        let b: Body = serde_json::from_value(body)
            .map_err(|e| ApiError::invalid("experiments", e.to_string()))?;
        let view = engine.replace_experiments(b.experiments, peer.map(|p| p.to_string()))?;
        Ok(axum::Json(view).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /admin/tenants`: the tenants in force (names, routes, limits; never a key digest).
pub async fn get_tenants(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(engine.tenants()).into_response()
}

/// `POST /admin/tenants/reload`: reads `[[tenants]]` and `tenants_file` again (as SIGHUP does); 400 naming
/// the problem when they do not load, the keys in force staying.
pub async fn reload_tenants(
    State(engine): State<Engine>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    match engine.reload_tenants() {
        Ok(n) => axum::Json(json!({"tenants": n})).into_response(),
        Err(e) => ApiError::Invalid {
            message: format!("tenants not reloaded (the keys in force stay): {e}"),
            param: Some("tenants_file".into()),
        }
        .into_response(),
    }
}
