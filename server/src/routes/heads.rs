//! `/admin/heads`: a checked live head swap ([`tiergate_engine::routing::heads`]). `POST /admin/heads/{route}` with
//! `{"dir": …}` loads a trained head beside the one in force and shadows it on live traffic; it is promoted
//! only if its checks pass. `POST /admin/heads/{route}/rollback` puts the replaced head back; `GET
//! /admin/heads` shows each route's head, its shadow and the history.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::routing::heads::{Holdout, StartError, StartRequest, MAX_SHADOW_REQUESTS};
use tiergate_engine::state::AppState;

/// `GET /admin/heads`.
pub async fn list(State(state): State<Arc<AppState>>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    let routes: Vec<serde_json::Value> = state
        .routing
        .route_order
        .iter()
        .filter_map(|n| state.routing.routes.get(n))
        .filter(|r| r.prefilter.is_some())
        .map(|r| {
            json!({"route": r.name, "version": r.head_version, "dir": state.routing.heads.dir_of(&r.name),
                "fusion_source": r.fusion.source, "can_roll_back": state.routing.heads.can_roll_back(&r.name),
                "shadow": state.routing.heads.shadow_of(&r.name).map(|s| s.view())})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": routes, "history": state.routing.heads.history()}))
        .into_response()
}

/// The HTTP error of a head swap's refusal.
fn refused(e: StartError, param: &'static str) -> ApiError {
    match e {
        StartError::Invalid(m) => ApiError::invalid(param, m),
        StartError::Conflict(m) => ApiError::Conflict(m),
        StartError::Unavailable(m) => ApiError::Unavailable(m),
    }
}

/// `POST /admin/heads/{route}`: the head in `dir` goes into shadow (202); 400 for a folder that is not a head
/// of this route's labels, `requests` out of 1–[`MAX_SHADOW_REQUESTS`] or a holdout over its bounds (checked
/// before a row is classified), 409 while another shadow runs or another start loads its head (refused before
/// this one loads), or when it is the head in force.
pub async fn start(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(route): Path<String>,
    ApiJson(req): ApiJson<StartRequest>,
) -> Response {
    let run = async {
        authorize_admin(state.admin_token(), &headers, peer.0)?;
        let current = state
            .routing
            .routes
            .get(&route)
            .ok_or_else(|| ApiError::NotFound(format!("no route `{route}`")))?;
        if current.prefilter.is_none() {
            return Err(ApiError::invalid(
                "route",
                format!("route `{route}` generates: it has no head"),
            ));
        }
        if req
            .requests
            .is_some_and(|n| !(1..=MAX_SHADOW_REQUESTS).contains(&n))
        {
            return Err(ApiError::invalid(
                "requests",
                format!("must be 1–{MAX_SHADOW_REQUESTS}"),
            ));
        }
        if !req.dir.join("head.json").is_file() {
            return Err(ApiError::invalid(
                "dir",
                format!(
                    "{}: no head.json (a `tiergate train` or `distill` folder)",
                    req.dir.display()
                ),
            ));
        }
        let _claim = state
            .routing
            .heads
            .claim(&route)
            .map_err(|e| refused(e, "dir"))?;
        let holdout = match req.holdout.clone() {
            Some(h) => Some(
                tokio::task::spawn_blocking(move || Holdout::read(&h))
                    .await
                    .map_err(|e| ApiError::Internal(e.to_string()))?
                    .map_err(|m| ApiError::invalid("holdout", m))?,
            ),
            None => None,
        };
        let (st, name, dir) = (state.clone(), route.clone(), req.dir.clone());
        let candidate = tokio::task::spawn_blocking(move || st.candidate_route(&name, &dir))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::invalid("dir", format!("{}: {e:#}", req.dir.display())))?;
        let shadow = state
            .routing
            .heads
            .begin(&state, candidate, &req, holdout)
            .map_err(|e| refused(e, "dir"))?;
        let mut body = shadow.view();
        body["object"] = json!("head.shadow");
        body["route"] = json!(route);
        body["in_force"] = json!(current.head_version);
        Ok::<_, ApiError>((StatusCode::ACCEPTED, axum::Json(body)).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /admin/heads/{route}/rollback`: the head the last swap replaced goes back in force, here and in the
/// shared record with its folder (409 when there is none, or when another replica changed the head first; 503
/// when the shared store does not answer — nothing changed).
pub async fn rollback(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(route): Path<String>,
) -> Response {
    let run = async {
        authorize_admin(state.admin_token(), &headers, peer.0)?;
        if !state.routing.routes.contains_key(&route) {
            return Err(ApiError::NotFound(format!("no route `{route}`")));
        }
        let (version, replaced) =
            tiergate_engine::routing::head_swap::roll_back_shared(&state, &route)
                .await
                .map_err(|e| refused(e, "route"))?;
        Ok::<_, ApiError>(
            axum::Json(
                json!({"object": "head.rollback", "route": route, "version": version,
                "replaced": replaced}),
            )
            .into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
