//! The chat door for in-process callers (a batch line): the same validation, the engine's one call and the
//! `chat.completion` body as the HTTP door renders it unstreamed, returned as values — no HTTP round trip.
//! [`ChatDoor`] is what the server hands the Batch API's runner ([`tiergate_engine::batch::Door`]).

use std::future::Future;
use std::pin::Pin;

use tiergate_engine::batch::{Door, LineAnswer, LineRequest};
use tiergate_engine::Engine;

use crate::error::ApiError;
use crate::openai::ChatRequest;
use crate::validate::{validate, Caller};

use super::respond::{completion, outcome_headers};

/// Answers `body` (a Chat Completions request, never streamed) for `caller`: the status the HTTP door would
/// answer with, the `chat.completion` or the error in OpenAI's shape, and the `x-tiergate-*` headers.
pub async fn completion_for(
    engine: &Engine,
    body: serde_json::Value,
    caller: Caller<'_>,
) -> LineAnswer {
    let failed = |e: ApiError, headers| LineAnswer {
        status: e.parts().0.as_u16(),
        body: e.body(),
        headers,
    };
    let parsed = serde_json::from_value::<ChatRequest>(body).map_err(|e| ApiError::Invalid {
        message: format!("invalid request body: {e}"),
        param: None,
    });
    let v = match parsed.and_then(|req| validate(req, |name| engine.route_facts(name), caller)) {
        Ok(v) => v,
        Err(e) => return failed(e, Default::default()),
    };
    let a = match engine.answer(&v).await {
        Ok(a) => a,
        Err(d) => return failed(ApiError::from(d.error), Default::default()),
    };
    let headers = |o: &tiergate_engine::model::outcome::Outcome| {
        outcome_headers(o)
            .into_iter()
            .filter(|(k, _)| k.starts_with("x-tiergate-"))
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v)))
            .collect()
    };
    let before = headers(&a.outcome);
    match completion(&v, a.body, a.outcome).await {
        Ok((body, outcome)) => LineAnswer {
            status: 200,
            body,
            headers: headers(&outcome),
        },
        Err(e) => failed(e, before),
    }
}

/// The chat door as the Batch API's runner reaches it.
pub struct ChatDoor;

impl Door for ChatDoor {
    fn answer<'a>(
        &'a self,
        engine: &'a Engine,
        req: LineRequest,
    ) -> Pin<Box<dyn Future<Output = LineAnswer> + Send + 'a>> {
        Box::pin(async move {
            // A line carries no headers: its budget is its route's default.
            let headers = axum::http::HeaderMap::new();
            let caller = Caller {
                tenant: req.tenant,
                batch: Some(req.line),
                headers: &headers,
                started: std::time::Instant::now(),
                forced: Ok(None),
            };
            completion_for(engine, req.body, caller).await
        })
    }
}
