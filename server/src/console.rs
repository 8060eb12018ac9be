//! `/console`: an operator's page embedded in the binary (no CDN, no build step), served on the admin
//! listener, and the data it polls (`GET /admin/console`): the live policy view, the ambiguity histogram of the
//! last 60 s, per-channel P95 of recent answers, per-tenant figures, the backends, the last 15 minutes as time
//! series , the answer cache, and the last decisions (no request text is kept).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};

use crate::auth::Peer;
use tiergate_engine::Engine;

/// The page.
const PAGE: &str = include_str!("console.html");

/// `GET /console`: the page (its data requests carry the admin credentials).
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// `GET /admin/console`: what the page shows ([`Engine::console`]).
pub async fn data(State(engine): State<Engine>, Peer(peer): Peer, headers: HeaderMap) -> Response {
    if let Err(e) = crate::auth::authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    axum::Json(engine.console()).into_response()
}
