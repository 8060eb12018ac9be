//! In-process HTTP tests: the real router and state, a tiny few-shot classifier (no download) and a stub
//! reranker worker process behind the real shared-memory queue. Every status code, streaming, headers, live
//! policy changes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tiergate_config::{Config, RoutingConfig};
use tower::ServiceExt;

mod common;
use common::rig::{admin, assert_openai_error, call, chat, force, post, rig, Rig, TOKEN};

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
    while r.state.llm.as_ref().unwrap().client.in_flight() == 0 {
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
    let live = r.state.policy.live_view(Instant::now());
    assert_eq!(
        live.escalated_share_60s, 0.0,
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
    let _held = r.state.admission.clone().try_acquire_owned().unwrap();
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", chat("classify", "x"))).await;
    assert_openai_error(s, &b, 429);
    assert_eq!(h["retry-after"], "1");
}

/// Probes and metrics are outside the admission limit: a server at its limit still answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_outside_the_admission_limit() {
    let r = rig(0, |c| c.server.max_in_flight = 1);
    let _held = r.state.admission.clone().try_acquire_owned().unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routing_is_validated_versioned_and_guarded() {
    let r = rig(0, |_| {});
    let (s, _, b) = call(&r.admin, admin("GET", None, false, None)).await;
    assert_openai_error(s, &b, 401);
    let (s, _, b) = call(&r.admin, admin("GET", None, true, None)).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    let live = [
        "theta_eff",
        "utilization",
        "escalated_share_10s",
        "escalated_share_60s",
        "queue_depth",
        "version",
    ];
    for k in RoutingConfig::fields()
        .iter()
        .map(String::as_str)
        .chain(live)
    {
        assert!(v.get(k).is_some(), "missing {k} in {v}");
    }
    assert_eq!(v["version"], 1);
    let (s, _, b) = call(
        &r.admin,
        admin(
            "PATCH",
            Some(json!({"theta_base": 0.5, "mode": "static"})),
            true,
            Some("1"),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (v["version"].as_u64(), v["theta_eff"].as_f64()),
        (Some(2), Some(0.5))
    );
    // Invalid values and unknown fields are refused; the policy stays.
    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"theta_base": 3})), true, None),
    )
    .await;
    assert!(assert_openai_error(s, &b, 400)["error"]["message"]
        .to_string()
        .contains("theta_base"));
    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"thetta": 0.1})), true, None),
    )
    .await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"k": 0.1})), true, Some("1")),
    )
    .await;
    assert_openai_error(s, &b, 412);
    let (s, _, b) = call(
        &r.admin,
        admin("PUT", Some(json!({"theta_base": 0.4})), true, None),
    )
    .await;
    assert_openai_error(s, &b, 400);
    assert_eq!(r.state.policy.current().version, 2);
    // The response header reports the new version.
    let (_, h, _) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    assert_eq!(h["x-tiergate-policy-version"], "2");
    assert_eq!(h["x-tiergate-threshold"], "0.5000");
}

/// Concurrent PATCHes of different fields without If-Match: each merges onto the latest version, none is
/// lost. Every writer only raises its field, so in version order every field must be non-decreasing: a
/// lost update shows as a later version carrying an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_without_if_match_lose_no_update() {
    let r = rig(0, |_| {});
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u64, f64, f64, f64)>::new()));
    let writer = |field: &'static str, values: Vec<f64>| {
        let (admin_app, seen) = (r.admin.clone(), seen.clone());
        tokio::spawn(async move {
            for v in values {
                let (s, _, b) = call(
                    &admin_app,
                    admin("PATCH", Some(json!({ field: v })), true, None),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
                let v: Value = serde_json::from_slice(&b).unwrap();
                let f = |k: &str| v[k].as_f64().unwrap();
                seen.lock().unwrap().push((
                    v["version"].as_u64().unwrap(),
                    f("theta_base"),
                    f("k"),
                    f("target_share"),
                ));
            }
        })
    };
    let steps =
        |from: f64| -> Vec<f64> { (0..150).map(|i| from + f64::from(i) / 1000.0).collect() };
    let (a, b, c) = (
        // Above the defaults (0.65, 0.15, 0.1), so the first write raises each field too.
        writer("theta_base", steps(0.7)),
        writer("k", steps(0.2)),
        writer("target_share", steps(0.2)),
    );
    a.await.unwrap();
    b.await.unwrap();
    c.await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|s| s.0);
    for w in seen.windows(2) {
        let (x, y) = (w[0], w[1]);
        assert!(
            y.1 >= x.1 && y.2 >= x.2 && y.3 >= x.3,
            "version {} lost an update of version {}: {x:?} then {y:?}",
            y.0,
            x.0
        );
    }
    let p = r.state.policy.current();
    assert_eq!(p.cfg.theta_base, 0.7 + 149.0 / 1000.0);
    assert_eq!(p.version, 1 + 450, "every PATCH made exactly one version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_info_redact_the_token() {
    // A Redis URL with a password (the policy store is not used with this rig's memory kind, so nothing
    // connects): /info must not show it either.
    let r = rig(1, |c| {
        c.policy_store.url = "redis://:hunter2@127.0.0.1:6379/0".into()
    });
    let (s, _, _) = call(&r.app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, b) = call(&r.app, Request::get("/ready").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (s, _, b) = call(&r.admin, Request::get("/info").body(Body::empty()).unwrap()).await;
    assert_openai_error(s, &b, 401);
    let info = Request::get("/info")
        .header("authorization", format!("bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (s, _, b) = call(&r.admin, info).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8_lossy(&b);
    assert!(
        !text.contains(TOKEN) && text.contains("<redacted>"),
        "{text}"
    );
    assert!(
        !text.contains("hunter2") && text.contains("redis://:<redacted>@127.0.0.1:6379/0"),
        "{text}"
    );
    // Admin and the config are not served on the public router at all.
    for path in ["/info", "/admin/routing"] {
        let (s, _, b) = call(&r.app, Request::get(path).body(Body::empty()).unwrap()).await;
        assert_openai_error(s, &b, 404);
    }
}

/// Classify and answer routes with an out-of-scope outcome, on the few-shot head (no `oos.json`: scored by
/// 1 − max p, threshold configured). The threshold moves live through `/admin/routing`, so the test pins each
/// outcome without depending on the tiny model's scores.
fn guarded(c: &mut Config) {
    for (name, kind) in [
        ("guarded", tiergate_config::RouteKind::Classify),
        ("guarded_answer", tiergate_config::RouteKind::Answer),
    ] {
        c.routes.push(tiergate_config::RouteConfig {
            name: name.into(),
            kind,
            head: None,
            prompts: None,
            out_of_scope: Some(tiergate_config::OutOfScopeConfig {
                label: "out_of_scope".into(),
                reply: Some("I can only help with cards and bills.".into()),
                threshold: Some(2.0),
                none_candidate: "none of these".into(),
            }),
            deadline_ms: None,
            max_deadline_ms: None,
            stages: None,
        });
    }
}

async fn patch_routing(r: &Rig, body: Value) {
    let (s, _, b) = call(&r.admin, admin("PATCH", Some(body), true, None)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
}

async fn json_answer(r: &Rig, model: &str, text: &str) -> (axum::http::HeaderMap, Value) {
    let mut body = chat(model, text);
    body["response_format"] = json!({"type": "json_object"});
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    (h, serde_json::from_str(content).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_answers_out_of_scope_at_tier0_and_the_threshold_moves_live() {
    let r = rig(0, guarded);
    // Threshold 2: no score is above it — in scope, with the score reported.
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(
        (v["label"].as_str(), v["out_of_scope"].as_bool()),
        (Some("card_lost"), Some(false))
    );
    let score: f32 = h["x-tiergate-oos-score"].to_str().unwrap().parse().unwrap();
    assert!((0.0..=1.0).contains(&score), "1 - max p: {score}");
    assert!(h.get("x-tiergate-out-of-scope").is_none());
    // A route without the outcome reports no score.
    let (_, h, _) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    assert!(h.get("x-tiergate-oos-score").is_none());

    // The live override puts every query out of scope (scores are >= 0 > -1).
    patch_routing(&r, json!({"oos_threshold": -1.0})).await;
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(v["out_of_scope"], true);
    assert_eq!(v["tier"], "tier0");
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    assert_eq!(h["x-tiergate-tier"], "tier0");
    // Plain classify: the label; answer route: the configured reply.
    let (_, _, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("guarded", "card lost")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "out_of_scope");
    let (_, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("guarded_answer", "pay bill")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "I can only help with cards and bills."
    );
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    // Routes without the outcome are untouched by the override.
    let (_, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "card_lost");
    assert!(h.get("x-tiergate-out-of-scope").is_none());
    // The console's decisions count it in its own channel.
    let recent = r.state.decisions.recent();
    let last_guarded = recent
        .iter()
        .rev()
        .find(|d| d.route == "guarded_answer")
        .unwrap();
    assert_eq!(last_guarded.channel, "out_of_scope");
    assert!(last_guarded.out_of_scope && last_guarded.oos.is_some());
    assert_eq!(recent.last().unwrap().channel, "tier0");

    // Back to each route's own threshold; a bad value is refused naming the field.
    patch_routing(&r, json!({"oos_threshold": null})).await;
    let (_, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(v["out_of_scope"], false);
    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"oos_margin": 2})), true, None),
    )
    .await;
    assert!(assert_openai_error(s, &b, 400)["error"]["message"]
        .to_string()
        .contains("oos_margin"));
}

/// An uncertain out-of-scope call goes to the LLM with "none of these" as its last candidate: the stub worker
/// scores a candidate by the words it shares with the text, so a query naming "none of these" gets it and a
/// query naming a label gets the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_out_of_scope_call_asks_the_llm_which_may_say_none() {
    let r = rig(1, guarded);
    // Every score within the band: every request escalates.
    patch_routing(
        &r,
        json!({"oos_threshold": 0.5, "oos_margin": 1.0, "theta_base": 1.0, "mode": "static"}),
    )
    .await;
    let (h, v) = json_answer(&r, "guarded", "none of these things").await;
    assert_eq!(h["x-tiergate-tier"], "llm", "{v}");
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(v["out_of_scope"], true);
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    let labels: Vec<&str> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"card_lost") && labels[0] == "out_of_scope",
        "{labels:?}"
    );
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(h["x-tiergate-tier"], "llm");
    assert_eq!(
        (v["label"].as_str(), v["out_of_scope"].as_bool()),
        (Some("card_lost"), Some(false)),
        "{v}"
    );
    // The LLM's "none" is counted in the escalated channel, flagged out of scope.
    let d = r.state.decisions.recent();
    let none = d.iter().find(|d| d.out_of_scope).unwrap();
    assert_eq!(none.channel, "escalated");

    // Without workers the escalation degrades to Tier-0's own call: out of scope above the threshold.
    let r = rig(0, guarded);
    patch_routing(&r, json!({"oos_threshold": -0.5, "oos_margin": 1.0})).await;
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(h["x-tiergate-degraded"], "no_llm");
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(
        r.state.decisions.recent().last().unwrap().channel,
        "degraded"
    );
}

fn digest(key: &str) -> String {
    use std::fmt::Write;
    // The test computes the SHA-256 the operator would (`printf %s "$KEY" | sha256sum`) with the server's own
    // crate, then checks the server finds the tenant by it.
    let d = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes());
    d.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn tenants(c: &mut Config) {
    c.tenants = vec![
        tiergate_config::TenantConfig {
            name: "a".into(),
            key_sha256: digest("key-a"),
            routes: Some(vec!["classify".into(), "answer".into()]),
            rate_per_s: Some(0.5),
            burst: Some(2.0),
            ..Default::default()
        },
        tiergate_config::TenantConfig {
            name: "b".into(),
            key_sha256: digest("key-b"),
            ..Default::default()
        },
    ];
}

fn with_key(mut req: Request<Body>, auth: Option<&str>) -> Request<Body> {
    if let Some(a) = auth {
        req.headers_mut()
            .insert("authorization", a.parse().unwrap());
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_need_a_known_key_keep_to_their_routes_and_their_rate() {
    let r = rig(0, tenants);
    // Missing, empty, malformed or unknown credentials: 401 invalid_api_key in OpenAI's shape, never a 5xx.
    for auth in [
        None,
        Some("Bearer"),
        Some("Bearer   "),
        Some("Basic a2V5LWE="),
        Some("key-a"),
        Some("Bearer key-c"),
    ] {
        let req = with_key(
            post("/v1/chat/completions", chat("classify", "card lost")),
            auth,
        );
        let (s, _, b) = call(&r.app, req).await;
        let v = assert_openai_error(s, &b, 401);
        assert_eq!(v["error"]["code"], "invalid_api_key", "{auth:?}");
    }
    let (s, _, b) = call(
        &r.app,
        with_key(
            Request::get("/v1/models").body(Body::empty()).unwrap(),
            None,
        ),
    )
    .await;
    assert_openai_error(s, &b, 401);
    // A known key: served, and counted as its tenant.
    let req = with_key(
        post("/v1/chat/completions", chat("classify", "card lost")),
        Some("Bearer key-a"),
    );
    let (s, _, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    // A route it may not use: 403.
    let req = with_key(
        post("/v1/chat/completions", chat("generate", "hello")),
        Some("Bearer key-a"),
    );
    let (s, _, b) = call(&r.app, req).await;
    assert!(assert_openai_error(s, &b, 403)["error"]["message"]
        .to_string()
        .contains("generate"));
    // Its burst of 2 is spent (two requests above): the next is 429 rate_limit_exceeded with Retry-After
    // (0.5/s: two seconds for a token).
    let req = with_key(
        post("/v1/chat/completions", chat("classify", "card lost")),
        Some("Bearer key-a"),
    );
    let (s, h, b) = call(&r.app, req).await;
    let v = assert_openai_error(s, &b, 429);
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(h["retry-after"], "2");
    // Another tenant is not slowed by it, and may use every route.
    for _ in 0..5 {
        let req = with_key(
            post("/v1/chat/completions", chat("answer", "pay bill")),
            Some("Bearer key-b"),
        );
        let (s, _, b) = call(&r.app, req).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    }
    // Probes stay open; the admin listener still wants the admin token, not a tenant's key.
    let (s, _, _) = call(&r.app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    let req = with_key(
        Request::get("/admin/routing").body(Body::empty()).unwrap(),
        Some("Bearer key-b"),
    );
    let (s, _, b) = call(&r.admin, req).await;
    assert_openai_error(s, &b, 401);
}

/// The keys file reloaded while traffic runs (`POST /admin/tenants/reload`, what SIGHUP does): a new key works
/// at once, a removed key gets 401, a file that does not load keeps the keys in force (400 naming it), and a
/// tenant sending throughout never sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_keys_file_reloads_under_traffic_without_dropping_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.toml");
    let write = |entries: &[(&str, &str)]| {
        let body: String = entries
            .iter()
            .map(|(name, key)| {
                format!(
                    "[[tenants]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n",
                    digest(key)
                )
            })
            .collect();
        std::fs::write(&file, body).unwrap();
    };
    write(&[("steady", "key-steady"), ("old", "key-old")]);
    let path = file.clone();
    let r = rig(0, move |c| c.tenants_file = Some(path));
    let status = |key: &'static str| {
        let app = r.app.clone();
        async move {
            let req = with_key(
                post("/v1/chat/completions", chat("classify", "card lost")),
                Some(&format!("Bearer {key}")),
            );
            call(&app, req).await.0
        }
    };
    assert_eq!(status("key-old").await, StatusCode::OK);
    assert_eq!(status("key-new").await, StatusCode::UNAUTHORIZED);
    // A tenant sends throughout the reloads (the reloads start once it has sent a few, and it stops after
    // a few more).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let traffic = {
        let (app, stop, sent) = (r.app.clone(), stop.clone(), sent.clone());
        tokio::spawn(async move {
            let mut codes = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let req = with_key(
                    post("/v1/chat/completions", chat("classify", "card lost")),
                    Some("Bearer key-steady"),
                );
                codes.push(call(&app, req).await.0);
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            codes
        })
    };
    let until = |n: usize| {
        let sent = sent.clone();
        async move {
            while sent.load(std::sync::atomic::Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    until(3).await;
    let reload = |admin: axum::Router| async move {
        call(
            &admin,
            Request::post("/admin/tenants/reload")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
    };
    write(&[("steady", "key-steady"), ("new", "key-new")]);
    let (s, _, b) = reload(r.admin.clone()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(status("key-new").await, StatusCode::OK);
    assert_eq!(status("key-old").await, StatusCode::UNAUTHORIZED);
    // A malformed file: refused, naming the file; the keys in force stay.
    std::fs::write(&file, "[[tenants]]\nname = \"broken\"\nkey_sha256 = 12\n").unwrap();
    let (s, _, b) = reload(r.admin.clone()).await;
    assert!(assert_openai_error(s, &b, 400)["error"]["message"]
        .to_string()
        .contains("keys.toml"));
    // A key that is not a digest: refused as well.
    std::fs::write(
        &file,
        "[[tenants]]\nname = \"plain\"\nkey_sha256 = \"sk-plain-key\"\n",
    )
    .unwrap();
    let (s, _, b) = reload(r.admin.clone()).await;
    assert!(assert_openai_error(s, &b, 400)["error"]["message"]
        .to_string()
        .contains("key_sha256"));
    assert_eq!(status("key-new").await, StatusCode::OK);
    // The admin API lists the tenants in force, never a digest.
    let (s, _, b) = call(
        &r.admin,
        Request::get("/admin/tenants")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    let names: Vec<&str> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["new", "steady"]);
    assert!(!String::from_utf8_lossy(&b).contains(&digest("key-new")));
    let before = sent.load(std::sync::atomic::Ordering::Relaxed);
    until(before + 3).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let codes = traffic.await.unwrap();
    assert!(
        codes.len() >= 5 && codes.iter().all(|c| *c == StatusCode::OK),
        "{} requests: {codes:?}",
        codes.len()
    );
}

/// A tenant over its LLM budget (`llm_seconds_per_min`) is answered by Tier-0 with `x-tiergate-degraded:
/// budget` on a classify route (never an error), gets 429 with Retry-After on a generate route (no Tier-0
/// answer there), while another tenant still reaches the LLM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_llm_budget_degrades_and_its_generations_are_429() {
    let r = rig(1, |c| {
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "300".into()];
        c.tenants = vec![
            tiergate_config::TenantConfig {
                name: "metered".into(),
                key_sha256: digest("key-m"),
                // 0.5 LLM-seconds banked, refilled at 1/120 s a second: two jobs of 300 ms spend it.
                llm_seconds_per_min: Some(0.5),
                ..Default::default()
            },
            tiergate_config::TenantConfig {
                name: "free".into(),
                key_sha256: digest("key-f"),
                ..Default::default()
            },
        ];
    });
    let ask = |key: &str, model: &str| {
        let mut req = with_key(
            post("/v1/chat/completions", chat(model, "card lost")),
            Some(&format!("Bearer {key}")),
        );
        force(&mut req, "0");
        req
    };
    for _ in 0..2 {
        let (s, h, b) = call(&r.app, ask("key-m", "classify")).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
        assert_eq!(h["x-tiergate-tier"], "llm");
    }
    let (s, h, b) = call(&r.app, ask("key-m", "classify")).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-tiergate-tier"], "tier0");
    assert_eq!(h["x-tiergate-degraded"], "budget");
    let (s, h, b) = call(&r.app, ask("key-m", "generate")).await;
    let v = assert_openai_error(s, &b, 429);
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    // About 0.1 LLM-second overdrawn at 1/120 per second: some twelve seconds.
    let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((5..=20).contains(&wait), "{wait}");
    let (s, h, _) = call(&r.app, ask("key-f", "classify")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-tier"], "llm");
    // The admin API shows what is left.
    let req = Request::get("/admin/tenants")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (_, _, b) = call(&r.admin, req).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let m = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "metered")
        .unwrap()
        .clone();
    assert!(m["llm_seconds_left"].as_f64().unwrap() < 0.0, "{m}");
    // The console's per-tenant figures: metered's two LLM answers, one over budget, one 429; free's one.
    let req = Request::get("/admin/console")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (_, _, b) = call(&r.admin, req).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let of = |name: &str| {
        v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {v}"))["counts"]
            .clone()
    };
    let m = of("metered");
    assert_eq!(
        (
            &m["requests"],
            &m["escalated"],
            &m["degraded"],
            &m["over_budget"],
            &m["errors"]
        ),
        (&json!(4), &json!(2), &json!(1), &json!(1), &json!(1)),
        "{m}"
    );
    assert!(m["llm_seconds"].as_f64().unwrap() >= 0.6, "{m}");
    assert_eq!(of("free")["escalated"], 1);
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

/// The error bound (`routing.max_error`) on a head without calibration rows allows θ = 0: every request must
/// escalate to hold it. With no LLM to take them, `on_breach` decides: `degrade` answers from Tier-0 flagged
/// `risk_bound`, `reject` is 503 `risk_bound`; the admin view says why θ is 0; `mode = "risk"` without
/// `max_error` is refused naming the field; without a bound the same request is Tier-0's, unflagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_bound_escalates_what_it_needs_and_a_breach_degrades_or_rejects() {
    let r = rig(0, |c| {
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
    });
    let ask = || post("/v1/chat/completions", chat("classify", "card lost"));
    let (s, h, _) = call(&r.app, ask()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        h.get("x-tiergate-degraded").is_none(),
        "θ = 1: Tier-0 alone"
    );
    assert_eq!(h["x-tiergate-tier"], "tier0");

    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"mode": "risk"})), true, None),
    )
    .await;
    let e = assert_openai_error(s, &b, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_error"),
        "{e}"
    );

    patch_routing(&r, json!({"mode": "risk", "max_error": 0.05})).await;
    let (s, h, _) = call(&r.app, ask()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-degraded"], "risk_bound");
    assert_eq!(h["x-tiergate-threshold"], "0.0000");
    let (_, _, b) = call(&r.admin, admin("GET", None, true, None)).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let risk = &v["risk"]["classify"];
    assert_eq!(risk["theta"], 0.0, "{v}");
    assert_eq!(risk["n_calibration"], 0);
    assert!(risk["note"].as_str().unwrap().contains("too few"), "{risk}");

    patch_routing(&r, json!({"on_breach": "reject"})).await;
    let (s, h, b) = call(&r.app, ask()).await;
    let e = assert_openai_error(s, &b, 503);
    assert_eq!(e["error"]["code"], "risk_bound");
    assert!(h.get("retry-after").is_some());

    // A forced θ is the operator's own: not capped by the bound.
    let mut req = ask();
    force(&mut req, "1");
    let (s, h, _) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-tier"], "tier0");
    assert!(h.get("x-tiergate-degraded").is_none());
}

fn tenant_chat(key: &str, text: &str) -> Request<Body> {
    with_key(
        post("/v1/chat/completions", chat("classify", text)),
        Some(&format!("Bearer {key}")),
    )
}

async fn give_feedback(r: &Rig, key: &str, body: Value) -> (StatusCode, Value) {
    let req = with_key(post("/v1/feedback", body), Some(&format!("Bearer {key}")));
    let (s, _, b) = call(&r.app, req).await;
    (s, serde_json::from_slice(&b).unwrap())
}

/// Feedback joins the decision behind an answer: right or wrong from the true label, the first of repeated
/// feedback stands (and the reply says so), another tenant's answer reads as unknown, and bad input is a 400
/// naming the field; trusted and untrusted feedback are counted apart. (This server keeps its records in
/// memory; the SQLite ledger's restart is `tests/tests/risk.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_joins_its_answer_once_for_its_own_tenant() {
    let trust = |c: &mut Config| {
        tenants(c);
        // Feedback is an API request like any other: tenant a's rate would refuse this test's own.
        (c.tenants[0].rate_per_s, c.tenants[0].burst) = (None, None);
        c.tenants[1].feedback = tiergate_config::FeedbackTrust::Trusted;
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
    };
    let r = rig(0, trust);
    let (s, _, b) = call(&r.app, tenant_chat("key-b", "card lost")).await;
    assert_eq!(s, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&b).unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    assert_eq!(answer["choices"][0]["message"]["content"], "card_lost");

    let (s, v) = give_feedback(&r, "key-b", json!({"id": id, "label": "pay_bill"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["correct"].as_bool(),
            v["trusted"].as_bool(),
            v["duplicate"].as_bool()
        ),
        (Some(false), Some(true), Some(false))
    );
    assert_eq!(v["channel"], "tier0");
    let (s, v) = give_feedback(&r, "key-b", json!({"id": id, "correct": true})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["correct"].as_bool(), v["duplicate"].as_bool()),
        (Some(false), Some(true)),
        "the first stands: {v}"
    );
    assert!(v["note"].as_str().unwrap().contains("first stands"));

    // Tenant a may not learn of, nor give feedback on, b's answer.
    let (s, v) = give_feedback(&r, "key-a", json!({"id": id, "correct": true})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    for (body, param) in [
        (json!({"id": "chatcmpl-none", "correct": true}), None),
        (json!({"id": id, "label": "no_such_label"}), Some("label")),
        (
            json!({"id": id, "label": "pay_bill", "correct": true}),
            Some("label"),
        ),
        (json!({"correct": true}), Some("id")),
        (json!({"id": id, "correct": "yes"}), None),
        (json!({"id": id, "rating": 5}), None),
    ] {
        let (s, v) = give_feedback(&r, "key-b", body.clone()).await;
        let want = if body["id"] == "chatcmpl-none" {
            404
        } else {
            400
        };
        let e = assert_openai_error(s, v.to_string().as_bytes(), want);
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{body}: {e}");
        }
    }
    // An untrusted tenant's feedback is recorded apart.
    let (_, _, b) = call(&r.app, tenant_chat("key-a", "card stolen")).await;
    let id_a = serde_json::from_slice::<Value>(&b).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, v) = give_feedback(&r, "key-a", json!({"id": id_a, "correct": true})).await;
    assert_eq!(
        (s, v["trusted"].as_bool()),
        (StatusCode::OK, Some(false)),
        "{v}"
    );
    let (_, _, b) = call(
        &r.admin,
        Request::get("/admin/feedback")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let sum: Value = serde_json::from_slice(&b).unwrap();
    let fb = &sum["routes"]["classify"]["feedback"]["tier0"];
    assert_eq!(
        (fb["trusted_n"].as_u64(), fb["trusted_correct"].as_u64()),
        (Some(1), Some(0)),
        "{sum}"
    );
    assert_eq!(
        (fb["untrusted_n"].as_u64(), fb["untrusted_correct"].as_u64()),
        (Some(1), Some(1))
    );
}

/// `routing.audit_rate = 1`: every label answer Tier-0 gives alone is queued with its text (an escalation the
/// LLM answered is not); a label closes it (the first stands, the text goes) and the silent error is the
/// share wrong, with its Clopper–Pearson interval, in `/admin/feedback` and `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audits_sample_tier0_alone_and_their_labels_estimate_its_silent_error() {
    let r = rig(1, |c| {
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
        c.routing.audit_rate = 1.0;
    });
    let admin_req = |method: &str, uri: &str, body: Option<Value>| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |v| Body::from(v.to_string())))
            .unwrap()
    };
    for text in ["card lost", "hello hi"] {
        let (s, _, _) = call(&r.app, post("/v1/chat/completions", chat("classify", text))).await;
        assert_eq!(s, StatusCode::OK);
    }
    let mut req = post("/v1/chat/completions", chat("classify", "pay bill"));
    force(&mut req, "0");
    let (_, h, _) = call(&r.app, req).await;
    assert_eq!(h["x-tiergate-tier"], "llm");
    let t = Instant::now();
    let items = loop {
        let (_, _, b) = call(
            &r.admin,
            admin_req("GET", "/admin/audits?route=classify", None),
        )
        .await;
        let v: Value = serde_json::from_slice(&b).unwrap();
        let items = v["data"].as_array().unwrap().clone();
        if items.len() >= 2 || t.elapsed() > Duration::from_secs(5) {
            break items;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let texts: Vec<&str> = items.iter().map(|i| i["text"].as_str().unwrap()).collect();
    assert_eq!(
        texts,
        ["card lost", "hello hi"],
        "the escalated request is not audited"
    );
    assert!(items
        .iter()
        .all(|i| i["probability"] == 1.0 && i["channel"] == "tier0"));

    let first = items[0]["id"].as_str().unwrap();
    let second = items[1]["id"].as_str().unwrap();
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            &format!("/admin/audits/{first}"),
            Some(json!({"label": "card_lost"})),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (_, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            &format!("/admin/audits/{second}"),
            Some(json!({"label": "pay_bill"})),
        ),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (v["wrong"].as_bool(), v["duplicate"].as_bool()),
        (Some(true), Some(false)),
        "{v}"
    );
    let (_, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            &format!("/admin/audits/{second}"),
            Some(json!({"label": "greeting"})),
        ),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (v["label"].as_str(), v["duplicate"].as_bool()),
        (Some("pay_bill"), Some(true)),
        "{v}"
    );
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            &format!("/admin/audits/{second}"),
            Some(json!({"label": "nope"})),
        ),
    )
    .await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            "/admin/audits/unknown",
            Some(json!({"label": "greeting"})),
        ),
    )
    .await;
    assert_openai_error(s, &b, 404);
    let (s, _, b) = call(
        &r.admin,
        Request::get("/admin/audits").body(Body::empty()).unwrap(),
    )
    .await;
    assert_openai_error(s, &b, 401);

    let (_, _, b) = call(&r.admin, admin_req("GET", "/admin/feedback", None)).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let c = &v["routes"]["classify"];
    assert_eq!(
        (
            c["audits"]["pending"].as_u64(),
            c["audits"]["labelled"].as_u64(),
            c["audits"]["wrong"].as_u64()
        ),
        (Some(0), Some(2), Some(1)),
        "{v}"
    );
    let e = &c["silent_error"];
    let (lo, hi) = tiergate_core::risk::clopper_pearson(1, 2, 0.95);
    assert_eq!(e["estimate"].as_f64(), Some(0.5));
    assert!(
        (e["lower"].as_f64().unwrap() - lo).abs() < 1e-9
            && (e["upper"].as_f64().unwrap() - hi).abs() < 1e-9,
        "{e}"
    );
    let (_, _, b) = call(&r.admin, admin_req("GET", "/admin/audits", None)).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&b).unwrap()["data"],
        json!([])
    );
}
