//! `/admin/heads`: a checked live head swap ([`tiergate_engine::routing::heads`]). `POST /admin/heads/{route}` with
//! `{"dir": …}` loads a trained head beside the one in force and shadows it on live traffic; it is promoted
//! only if its checks pass. `POST /admin/heads/{route}/rollback` puts the replaced head back; `GET
//! /admin/heads` shows each route's head, its shadow and the history.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::Engine;
use tiergate_engine::StartRequest;

/// `GET /admin/heads`.
pub async fn list(State(engine): State<Engine>, peer: Peer, headers: HeaderMap) -> Response {
    if let Err(e) = authorize_admin(engine.admin_token(), &headers, peer.0) {
        return e.into_response();
    }
    axum::Json(engine.heads()).into_response()
}

/// `POST /admin/heads/{route}`: the head in `dir` goes into shadow (202); 400 for a folder that is not a head
/// of this route's labels, a `requests` or holdout out of bounds, 409 while another shadow runs or another
/// start loads its head, or when it is the head in force ([`Engine::shadow_head`]).
pub async fn start(
    State(engine): State<Engine>,
    peer: Peer,
    headers: HeaderMap,
    Path(route): Path<String>,
    ApiJson(req): ApiJson<StartRequest>,
) -> Response {
    let run = async {
        authorize_admin(engine.admin_token(), &headers, peer.0)?;
        let body = engine.shadow_head(&route, req).await?;
        Ok::<_, ApiError>((StatusCode::ACCEPTED, axum::Json(body)).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /admin/heads/{route}/rollback`: the head the last swap replaced goes back in force, here and in the
/// shared record with its folder (409 when there is none, or when another replica changed the head first; 503
/// when the shared store does not answer — nothing changed).
pub async fn rollback(
    State(engine): State<Engine>,
    peer: Peer,
    headers: HeaderMap,
    Path(route): Path<String>,
) -> Response {
    let run = async {
        authorize_admin(engine.admin_token(), &headers, peer.0)?;
        let body = engine.roll_back_head(&route).await?;
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
