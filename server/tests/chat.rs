//! In-process chat API tests: the real router and state, a tiny few-shot classifier (no download) and a stub
//! reranker worker process behind the real shared-memory queue. Answers and their headers, streaming, every
//! error's shape and status, the admission limit, degrading or rejecting a failed escalation, a budget too short
//! for the LLM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tiergate_config::Config;
use tower::ServiceExt;

mod common;
use common::rig::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_answer_and_headers() {
    let r = rig(1, |_| {});
    let (s, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "card_lost");
    assert_eq!(v["model"], "classify");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    for k in [
        "x-tiergate-tier",
        "x-tiergate-confidence",
        "x-tiergate-threshold",
        "x-tiergate-policy-version",
        "x-request-id",
        "server-timing",
    ] {
        assert!(h.get(k).is_some(), "missing header {k}");
    }
    assert!(h["server-timing"]
        .to_str()
        .unwrap()
        .contains("prefilter;dur="));
    let (_, _, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("answer", "pay bill")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Go to Payments.");
    // Models list.
    let (s, _, b) = call(
        &r.app,
        Request::get("/v1/models").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["classify", "answer", "generate"]);
    // `created` is a Unix time (the server's start), as OpenAI's models list has it.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for m in v["data"].as_array().unwrap() {
        let created = m["created"].as_u64().unwrap();
        assert!(
            created + 600 > now && created <= now,
            "created {created}, now {now}"
        );
    }
}

/// `generate` is held to the LLM in-flight limit like the escalations: with one slot taken by a slow
/// generation, a second one is refused (503, OpenAI shape) instead of queueing past the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_honours_the_in_flight_limit() {
    let r = rig(1, |c| {
        c.reranker.max_in_flight = 1;
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "300".into()];
    });
    let app = r.app.clone();
    let slow = tokio::spawn(async move {
        call(
            &app,
            post("/v1/chat/completions", chat("generate", "one two three")),
        )
        .await
    });
    let t = Instant::now();
    while r.engine.console()["backends"][0]["running"] == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the first generation never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (s, _, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("generate", "four five")),
    )
    .await;
    let e = assert_openai_error(s, &b, 503);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retry later"),
        "{e}"
    );
    let (s, _, b) = slow.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (s, _, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("generate", "six")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threshold_header_forces_tiers_and_rerank_fuses() {
    let r = rig(1, |_| {});
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "1.0");
    let (_, h, _) = call(&r.app, req).await;
    assert_eq!(h["x-tiergate-tier"], "tier0");
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    let (s, h, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-tiergate-tier"], "llm");
    assert!(h.get("x-tiergate-degraded").is_none());
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"], "card_lost",
        "stub shares the words card, lost"
    );
    // Forced decisions stay out of the policy's statistics.
    let (live, _) = r.engine.policy(&Default::default()).unwrap();
    assert_eq!(
        live["escalated_share_60s"], 0.0,
        "forced escalations were counted"
    );
    for bad in ["abc", "-1", "1.5", "NaN"] {
        let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
        force(&mut req, bad);
        let (s, _, b) = call(&r.app, req).await;
        assert_openai_error(s, &b, 400);
    }
    // Without the admin token, or with a wrong one, the override is refused, not ignored.
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    req.headers_mut()
        .insert("x-tiergate-threshold", "0".parse().unwrap());
    let (s, _, b) = call(&r.app, req).await;
    assert_openai_error(s, &b, 403);
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    req.headers_mut()
        .insert("x-tiergate-admin-token", "secret-tokeN".parse().unwrap());
    let (s, _, b) = call(&r.app, req).await;
    assert_openai_error(s, &b, 403);
    // The policy can switch overrides off; then even the token does not help.
    let r = rig(1, |c| c.routing.allow_header_override = false);
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    let (s, _, b) = call(&r.app, req).await;
    assert_openai_error(s, &b, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_and_json_object_on_classify() {
    let r = rig(0, |_| {});
    let mut body = chat("classify", "hello hi");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    body["response_format"] = json!({"type": "json_object"});
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    let lp = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(lp["token"], "greeting");
    assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2);
    let content: Value =
        serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["label"], "greeting");
    assert!(content["confidence"].is_number() && content["tier"].is_string());
    assert!(
        content["candidates"][0]["label"].is_string() && content["candidates"][0]["p"].is_number()
    );
}

fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_classify_and_generate() {
    let r = rig(1, |_| {});
    let mut body = chat("classify", "pay bill");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(h["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let data = sse_data(&b);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["model"] == "classify" && c["object"] == "chat.completion.chunk"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "pay_bill");
    assert!(
        chunks.last().unwrap()["usage"]["total_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let mut body = chat("generate", "hello there");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-tier"], "llm");
    let data = sse_data(&b);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "stub: hello there");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 3);

    let mut body = chat("generate", "one two three four");
    body["max_tokens"] = json!(2);
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "stub: one");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_has_the_openai_shape_and_status() {
    let r = rig(0, |_| {});
    let raw = |body: &str| {
        Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s, _, b) = call(&r.app, raw("{not json")).await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(&r.app, raw(r#"{"model":"classify","messages":5}"#)).await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(
        &r.app,
        Request::post("/v1/chat/completions")
            .body(Body::from("{}"))
            .unwrap(),
    )
    .await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", chat("nope", "x"))).await;
    let v = assert_openai_error(s, &b, 404);
    assert_eq!(v["error"]["param"], "model");
    let mut n2 = chat("classify", "x");
    n2["n"] = json!(2);
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", n2)).await;
    assert_eq!(assert_openai_error(s, &b, 400)["error"]["param"], "n");
    let (s, _, b) = call(&r.app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_openai_error(s, &b, 404);
    let (s, _, b) = call(
        &r.app,
        Request::delete("/v1/chat/completions")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_openai_error(s, &b, 405);
    let big = chat("classify", &"x".repeat(20_000));
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", big)).await;
    assert_openai_error(s, &b, 413);
    // No LLM: generate is 503; classify escalations degrade to Tier-0 with the reason.
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", chat("generate", "x"))).await;
    assert_openai_error(s, &b, 503);
    assert!(h.get("retry-after").is_some());
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    let (s, h, _) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-degraded"], "no_llm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_limit_is_429_with_retry_after() {
    let r = rig(0, |c| c.server.max_in_flight = 1);
    // The one permit is held, as a request in flight holds it.
    let _held = in_flight(&r).await;
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_openai_error(s, &b, 429);
    assert_eq!(h["retry-after"], "1");
}

/// A continuation is admitted before its stored conversation is read: at the limit it is 429 at once, not
/// the lookup's answer (an id nobody stored is 400 `previous_response_not_found` when a permit is free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_is_admitted_before_its_store_is_read() {
    let r = rig(0, |c| {
        c.server.max_in_flight = 1;
        c.responses.store = true;
    });
    let body =
        json!({"model": "classify", "input": "and then", "previous_response_id": "resp_nobody"});
    let (s, _, b) = call(&r.app, post("/v1/responses", body.clone())).await;
    assert_openai_error(s, &b, 400);
    let b: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(b["error"]["code"], "previous_response_not_found");
    let _held = in_flight(&r).await;
    let (s, h, b) = call(&r.app, post("/v1/responses", body)).await;
    assert_openai_error(s, &b, 429);
    assert_eq!(h["retry-after"], "1");
}

/// Probes and metrics are outside the admission limit: a server at its limit still answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_outside_the_admission_limit() {
    let r = rig(0, |c| c.server.max_in_flight = 1);
    let _held = in_flight(&r).await;
    for path in ["/health", "/ready"] {
        let (s, _, b) = call(&r.app, Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&b));
    }
    // No recorder is installed in this test process: /metrics says so, but is not refused with 429.
    let (s, _, _) = call(
        &r.app,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_ne!(s, StatusCode::TOO_MANY_REQUESTS);
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_openai_error(s, &b, 429);
}

/// A streamed answer holds its admission permit until its body is finished (or dropped), not only until the
/// handler returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_counts_against_the_limit_for_its_whole_life() {
    let r = rig(1, |c| {
        c.server.max_in_flight = 1;
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "300".into()];
    });
    let mut body = chat("generate", "one two three four");
    body["stream"] = json!(true);
    let streaming = r
        .app
        .clone()
        .oneshot(post("/v1/chat/completions", body))
        .await
        .unwrap();
    assert_eq!(streaming.status(), StatusCode::OK);
    // Headers are out, the body is still streaming: the one permit is taken.
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_openai_error(s, &b, 429);
    let text = streaming.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("[DONE]"));
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    // A client that goes away mid-stream gives the permit back too.
    let mut body = chat("generate", "one two three four");
    body["stream"] = json!(true);
    let dropped = r
        .app
        .clone()
        .oneshot(post("/v1/chat/completions", body))
        .await
        .unwrap();
    drop(dropped);
    let (s, _, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_escalations_degrade_or_reject_as_configured() {
    // Every stub worker crashes on its first job: the job is retried once, then fails with WorkerDown.
    let crash =
        |c: &mut Config| c.reranker.extra_args = vec!["--stub-crash-after".into(), "1".into()];
    let r = rig(1, crash);
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    let (s, h, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-tiergate-degraded"], "worker_down");
    assert_eq!(h["x-tiergate-tier"], "tier0");
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"], "card_lost",
        "the Tier-0 answer"
    );

    let r = rig(1, |c| {
        crash(c);
        c.server.on_escalation_failure = tiergate_config::FailureMode::Reject;
    });
    let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
    force(&mut req, "0");
    let (s, _, b) = call(&r.app, req).await;
    assert_openai_error(s, &b, 503);
}

/// A request's budget (`x-tiergate-deadline-ms`): not a positive integer, or above the route's
/// `max_deadline_ms`, is 400 naming the header; an escalation predicted not to finish within it is never
/// queued — Tier-0 answers (`x-tiergate-degraded: deadline_unreachable`) and a generation is 504; with room,
/// it escalates. The prediction: the LLM's recent service times (the 1 s prior before any), plus the wait for
/// a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_too_short_for_the_llm_is_answered_by_tier0() {
    let r = rig(1, |c| {
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "200".into()];
        c.routes = vec![
            tiergate_config::RouteConfig {
                name: "classify".into(),
                kind: tiergate_config::RouteKind::Classify,
                head: None,
                prompts: None,
                out_of_scope: None,
                deadline_ms: None,
                max_deadline_ms: Some(30_000),
                stages: None,
                cache_generations: false,
                steer: None,
                context_turns: 0,
                context_chars: 400,
                aliases: Vec::new(),
                default: false,
                max_tokens: None,
                max_text_chars: None,
            },
            tiergate_config::RouteConfig {
                name: "generate".into(),
                kind: tiergate_config::RouteKind::Generate,
                head: None,
                prompts: None,
                out_of_scope: None,
                deadline_ms: Some(50),
                max_deadline_ms: None,
                stages: None,
                cache_generations: false,
                steer: None,
                context_turns: 0,
                context_chars: 400,
                aliases: Vec::new(),
                default: false,
                max_tokens: None,
                max_text_chars: None,
            },
        ];
    });
    let ask = |model: &str, budget: Option<&str>| {
        let mut req = post("/v1/chat/completions", chat(model, "card lost"));
        force(&mut req, "0");
        if let Some(b) = budget {
            req.headers_mut()
                .insert("x-tiergate-deadline-ms", b.parse().unwrap());
        }
        req
    };
    for bad in ["abc", "0", "-1", "2.5", "30001"] {
        let (s, _, b) = call(&r.app, ask("classify", Some(bad))).await;
        let v = assert_openai_error(s, &b, 400);
        assert_eq!(v["error"]["param"], "x-tiergate-deadline-ms", "{bad}: {v}");
    }
    // 100 ms against the 1 s prior: not queued, Tier-0 answers at once.
    let t = Instant::now();
    let (s, h, b) = call(&r.app, ask("classify", Some("100"))).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-tiergate-tier"], "tier0");
    assert_eq!(h["x-tiergate-degraded"], "deadline_unreachable");
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // With room it escalates; after a few reranks the measured ~200 ms replaces the prior.
    for _ in 0..4 {
        let (_, h, _) = call(&r.app, ask("classify", Some("3000"))).await;
        assert_eq!(h["x-tiergate-tier"], "llm");
    }
    let (_, h, _) = call(&r.app, ask("classify", Some("600"))).await;
    assert_eq!(
        h["x-tiergate-tier"], "llm",
        "600 ms fits a 200 ms rerank once measured"
    );
    // The generate route's default budget of 50 ms is below any generation: 504 at once.
    let (s, _, b) = call(&r.app, ask("generate", None)).await;
    assert_openai_error(s, &b, 504);
}
