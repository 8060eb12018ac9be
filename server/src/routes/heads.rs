//! `/admin/heads`: a checked live head swap ([`tiergate_engine::heads`]). `POST /admin/heads/{route}` with
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
use tiergate_engine::heads::{StartError, StartRequest};
use tiergate_engine::state::AppState;

/// `GET /admin/heads`.
pub async fn list(State(state): State<Arc<AppState>>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(state.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    let routes: Vec<serde_json::Value> = state
        .route_order
        .iter()
        .filter_map(|n| state.routes.get(n))
        .filter(|r| r.prefilter.is_some())
        .map(|r| {
            json!({"route": r.name, "version": r.head_version, "dir": state.heads.dir_of(&r.name),
                "fusion_source": r.fusion.source, "can_roll_back": state.heads.can_roll_back(&r.name),
                "shadow": state.heads.shadow_of(&r.name).map(|s| s.view())})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": routes, "history": state.heads.history()}))
        .into_response()
}

/// `POST /admin/heads/{route}`: the head in `dir` goes into shadow (202); 400 for a folder that is not a head
/// of this route's labels, 409 while another shadow runs or when it is the head in force.
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
            .routes
            .get(&route)
            .ok_or_else(|| ApiError::NotFound(format!("no route `{route}`")))?;
        if current.prefilter.is_none() {
            return Err(ApiError::invalid(
                "route",
                format!("route `{route}` generates: it has no head"),
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
        if let Some(h) = &req.holdout {
            if !h.is_file() {
                return Err(ApiError::invalid(
                    "holdout",
                    format!("{}: no such file", h.display()),
                ));
            }
        }
        let (st, name, dir) = (state.clone(), route.clone(), req.dir.clone());
        let candidate = tokio::task::spawn_blocking(move || st.candidate_route(&name, &dir))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::invalid("dir", format!("{}: {e:#}", req.dir.display())))?;
        let shadow = state
            .heads
            .begin(&state, candidate, &req)
            .map_err(|e| match e {
                StartError::Invalid(m) => ApiError::invalid("dir", m),
                StartError::Conflict(m) => ApiError::Conflict(m),
            })?;
        let mut body = shadow.view();
        body["object"] = json!("head.shadow");
        body["route"] = json!(route);
        body["in_force"] = json!(current.head_version);
        Ok::<_, ApiError>((StatusCode::ACCEPTED, axum::Json(body)).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /admin/heads/{route}/rollback`: the head the last swap replaced goes back in force (409 when there is
/// none).
pub async fn rollback(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(route): Path<String>,
) -> Response {
    let run = || {
        authorize_admin(state.admin_token(), &headers, peer.0)?;
        if !state.routes.contains_key(&route) {
            return Err(ApiError::NotFound(format!("no route `{route}`")));
        }
        let (version, replaced) = state.heads.roll_back(&state, &route).ok_or_else(|| {
            ApiError::Conflict(format!(
                "route `{route}` has no replaced head to roll back to"
            ))
        })?;
        Ok::<_, ApiError>(
            axum::Json(
                json!({"object": "head.rollback", "route": route, "version": version,
                "replaced": replaced}),
            )
            .into_response(),
        )
    };
    run().unwrap_or_else(IntoResponse::into_response)
}
