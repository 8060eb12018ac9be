//! A trivial OpenAI-style endpoint (fixed answer, no model) on one thread, to measure what the bench itself
//! can drive: `cargo run -p tiergate-bench --example trivial_endpoint -- 127.0.0.1:8099`.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":0,"model":"trivial","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

async fn chat() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::HeaderName::from_static("x-tiergate-tier"), "tier0"),
        ],
        ANSWER,
    )
}

async fn models() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"object":"list","data":[{"id":"trivial","object":"model","tiergate_kind":"classify"}]}"#,
    )
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8099".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models));
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        eprintln!("trivial endpoint on http://{}", listener.local_addr()?);
        axum::serve(listener, app).await
    })
}
