//! `/admin/audits`: the answers Tier-0 gave alone that were drawn for audit (`routing.audit_rate`), waiting
//! for a true label, and `POST /admin/audits/{id}` to give it (the first label stands); `/admin/feedback`:
//! per route, Tier-0's silent error from the labelled audits with a Clopper–Pearson interval, and feedback
//! per channel (trusted and untrusted apart). Admin token required.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::feedback::blocking;
use crate::auth::{authorize_admin, Peer};
use crate::error::ApiError;
use crate::extract::ApiJson;
use tiergate_engine::evidence::ledger::{now_ms, First, Ledger};
use tiergate_engine::evidence::record::Gold;
use tiergate_engine::state::AppState;

fn ledger(state: &AppState, headers: &HeaderMap, peer: Peer) -> Result<Arc<Ledger>, ApiError> {
    authorize_admin(state.admin_token(), headers, peer.0)?;
    state.evidence.ledger.clone().ok_or_else(|| {
        ApiError::NotFound("feedback is off on this server ([feedback] enabled)".into())
    })
}

/// `GET /admin/audits?route=&limit=&head=any`: pending items of each route's head in force (`head=any`: of
/// every head), oldest first (default 50, at most 1000).
pub async fn list(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let run = async {
        let ledger = ledger(&state, &headers, peer)?;
        let limit = match q.get("limit") {
            None => 50,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| ApiError::invalid("limit", "must be an integer in [1, 1000]"))?,
        };
        let route = q.get("route").cloned();
        if let Some(r) = &route {
            if !state.routing.routes.contains_key(r) {
                return Err(ApiError::UnknownModel(r.clone()));
            }
        }
        // Items about each route's head in force only (`?head=any`: every head's).
        let heads: Option<tiergate_engine::evidence::ledger::Heads> = match q
            .get("head")
            .map(String::as_str)
        {
            Some("any") => None,
            None => Some(
                state
                    .routing
                    .routes
                    .iter()
                    .map(|(n, r)| (n, r.head_version.clone()))
                    .collect(),
            ),
            Some(_) => return Err(ApiError::invalid("head", "only `any` (every head's items)")),
        };
        let store = ledger.store();
        let items =
            blocking(move || store.pending(route.as_deref(), heads.as_ref(), limit)).await?;
        Ok::<_, ApiError>(axum::Json(json!({"object": "list", "data": items})).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The body of `POST /admin/audits/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRequest {
    /// The true label.
    pub label: String,
}

/// `POST /admin/audits/{id}`: the item's true label.
pub async fn label(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<LabelRequest>,
) -> Response {
    let run = async {
        let ledger = ledger(&state, &headers, peer)?;
        let store = ledger.store();
        let lookup = id.clone();
        let item = blocking(move || store.audit(&lookup))
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no audit item `{id}`")))?;
        let route = state.routing.routes.get(&item.route);
        let route = route.as_deref();
        // A label of the route, or its out-of-scope label (the query was one no label covers).
        let known = route
            .and_then(|r| r.prefilter.as_ref())
            .is_some_and(|p| p.labels().contains(&req.label))
            || route
                .and_then(|r| r.out_of_scope.as_ref())
                .is_some_and(|o| o.label == req.label);
        if !known {
            return Err(ApiError::invalid(
                "label",
                format!("`{}` is not a label of route `{}`", req.label, item.route),
            ));
        }
        let store = ledger.store();
        let given = req.label.clone();
        let first = blocking(move || store.label(&id, &given)).await?;
        let (label, duplicate) = match first {
            First::Written(l) => (l, false),
            First::Already(l) => (l, true),
            First::Gone => {
                return Err(ApiError::NotFound(format!(
                    "audit item `{}` expired before its label was written",
                    item.id
                )))
            }
        };
        if let (false, Some(rec), Some(text)) = (duplicate, &state.evidence.recorder, &item.text) {
            rec.write_gold(&Gold {
                source: "audit",
                route: &item.route,
                text,
                label: &label,
                answered: Some(&item.answered),
                ambiguity: Some(item.ambiguity),
                probability: Some(item.probability),
            });
        }
        let mut body = json!({"object": "audit", "id": item.id, "route": item.route, "answered": item.answered,
            "label": label, "wrong": item.answered != label, "duplicate": duplicate});
        if duplicate {
            body["note"] = json!("this item was already labelled: the first label stands");
        }
        Ok::<_, ApiError>(axum::Json(body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /admin/feedback`: per route, the silent error from audits and feedback per channel, read now.
pub async fn summary(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ledger = ledger(&state, &headers, peer)?;
        let store = ledger.store();
        let s = blocking(move || store.summary(now_ms())).await?;
        let agreement = state.agreement();
        // Each route's figures are of its head in force (a swap starts its evidence anew).
        let head = |r: &str| state.routing.routes.get(r).map(|x| x.head_version.clone());
        let mut routes: serde_json::Map<String, serde_json::Value> = s
            .routes
            .iter()
            .map(|(r, v)| (r.clone(), v.view(head(r).as_deref())))
            .collect();
        for (r, a) in &agreement {
            let v = routes.entry(r.clone()).or_insert_with(|| {
                tiergate_engine::evidence::ledger::RouteSummary::default().view(head(r).as_deref())
            });
            v["llm_agreement"] = a.view();
        }
        Ok::<_, ApiError>(
            axum::Json(json!({"routes": routes, "waiting": ledger.waiting()})).into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
