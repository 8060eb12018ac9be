//! A streamed answer's head while the model is still reading the prompt. The engine answers a generation
//! once its backend has produced a first event, and an agent's prompt can take minutes to prefill on a CPU:
//! an agent whose idle timeout fires then retries, and the whole prompt is read again. So a streamed request
//! whose answer has not started within `server.stream_head_ms` gets its response head (200, an event stream)
//! at that moment, keep-alive events every `server.keepalive_ms` while it waits, then the answer's own events;
//! a refusal that comes after the head is the dialect's error event. Quick answers and quick refusals (the
//! admission limit, a tenant's rate, an open breaker) are unaffected: they keep their status and headers.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// The dialect of the events an early head sends.
#[derive(Debug, Clone, Copy)]
pub enum Dialect {
    Chat,
    Messages,
    Responses,
}

impl Dialect {
    /// A keep-alive: an SSE comment, or Anthropic's `ping` event.
    fn ping(self) -> Bytes {
        match self {
            Dialect::Messages => Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"),
            Dialect::Chat | Dialect::Responses => Bytes::from_static(b": keep-alive\n\n"),
        }
    }

    /// A refusal that came after the head (`body`: the error response's JSON, in OpenAI's shape) as the
    /// dialect's error event.
    fn error(self, status: StatusCode, body: &[u8]) -> Bytes {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or("the request failed");
        let text = match self {
            Dialect::Chat => format!("data: {v}\n\ndata: [DONE]\n\n"),
            Dialect::Messages => format!(
                "event: error\ndata: {}\n\n",
                crate::anthropic::error_body(status.as_u16(), message)
            ),
            Dialect::Responses => format!(
                "event: error\ndata: {}\n\n",
                json!({"type": "error", "code": v["error"]["code"], "message": message,
                       "param": v["error"]["param"], "sequence_number": 0})
            ),
        };
        Bytes::from(text)
    }
}

/// When to send a streamed answer's head early, and how often to keep it alive.
#[derive(Debug, Clone, Copy)]
pub struct Early {
    pub wait: Duration,
    pub quiet: Duration,
    pub dialect: Dialect,
}

/// A door's answer: `answer` itself, or for a streamed request ([`answer_streamed`]) its events behind an
/// early head when it is slow to start.
pub async fn answered<F>(
    server: &tiergate_config::ServerConfig,
    stream: bool,
    dialect: Dialect,
    answer: F,
) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    if !stream {
        return answer.await;
    }
    let early = Early {
        wait: Duration::from_millis(server.stream_head_ms),
        quiet: Duration::from_millis(server.keepalive_ms),
        dialect,
    };
    answer_streamed(early, answer).await
}

/// `answer` (the door's engine call and rendering) as it is when it comes within `e.wait`; else an event
/// stream started now that carries keep-alives, then `answer`'s events (or its error as an event). A client
/// that leaves drops `answer`, which cancels its job.
pub async fn answer_streamed<F>(e: Early, answer: F) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    let mut answer = Box::pin(answer);
    if let Ok(resp) = tokio::time::timeout(e.wait, &mut answer).await {
        return resp;
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    // The request's span goes with the answer, so its log lines and trace stay the request's.
    let span = tracing::Span::current();
    let run = async move {
        let mut ticks = tokio::time::interval(e.quiet);
        ticks.tick().await; // the first tick is immediate: the head itself says the stream is alive
        let resp = loop {
            tokio::select! {
                r = &mut answer => break r,
                _ = ticks.tick() => if tx.send(Ok(e.dialect.ping())).await.is_err() { return },
            }
        };
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let _ = tx.send(Ok(e.dialect.error(status, &bytes))).await;
            return;
        }
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx.send(Ok(data)).await.is_err() {
                    return; // client gone: dropping the body cancels the generation
                }
            }
        }
    };
    tokio::spawn(tracing::Instrument::instrument(run, span));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn text(resp: Response) -> String {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn early(dialect: Dialect) -> Early {
        Early {
            wait: Duration::from_millis(50),
            quiet: Duration::from_millis(40),
            dialect,
        }
    }

    #[tokio::test]
    async fn a_quick_answer_is_untouched_and_a_slow_one_gets_its_head_then_pings() {
        let quick = answer_streamed(early(Dialect::Chat), async {
            Response::builder()
                .status(429)
                .body(Body::from("{}"))
                .unwrap()
        })
        .await;
        assert_eq!(quick.status(), 429, "a quick refusal keeps its status");
        let t = std::time::Instant::now();
        let slow = answer_streamed(early(Dialect::Messages), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Response::new(Body::from("event: message_start\ndata: {}\n\n"))
        })
        .await;
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "the head came early"
        );
        assert_eq!(slow.status(), 200);
        let body = text(slow).await;
        assert!(body.matches("event: ping").count() >= 3, "{body}");
        assert!(
            body.ends_with("event: message_start\ndata: {}\n\n"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_late_refusal_is_the_dialects_error_event() {
        let refusal = || async {
            tokio::time::sleep(Duration::from_millis(120)).await;
            let body = json!({"error": {"message": "busy", "type": "server_error", "param": null, "code": "llm_unavailable"}});
            Response::builder()
                .status(503)
                .body(Body::from(body.to_string()))
                .unwrap()
        };
        let m = text(answer_streamed(early(Dialect::Messages), refusal()).await).await;
        assert!(
            m.contains("event: error\ndata: {")
                && m.contains("\"overloaded_error\"")
                && m.contains("busy"),
            "{m}"
        );
        let r = text(answer_streamed(early(Dialect::Responses), refusal()).await).await;
        assert!(
            r.contains("\"code\":\"llm_unavailable\"") && r.contains("event: error"),
            "{r}"
        );
        let c = text(answer_streamed(early(Dialect::Chat), refusal()).await).await;
        assert!(
            c.contains("\"message\":\"busy\"") && c.ends_with("data: [DONE]\n\n"),
            "{c}"
        );
    }
}
