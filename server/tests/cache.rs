//! Tier −1, the answer cache, through the real router: the real state over the tiny few-shot classifier and
//! stub reranker workers behind the real shared-memory queue (the stub scores by word overlap, so a verdict is
//! deterministic and a fresh one can be compared with a cached one).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use serde_json::{json, Value};
use tiergate_config::Config;

use common::rig::*;

fn cached(c: &mut Config) {
    c.cache.enabled = true;
}

/// A chat request that escalates (θ forced to 0), with extra headers.
fn ask(model: &str, text: &str, headers: &[(&'static str, &str)]) -> Request<Body> {
    let mut body = chat(model, text);
    body["response_format"] = json!({"type": "json_object"});
    let mut req = post("/v1/chat/completions", body);
    force(&mut req, "0");
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    req
}

async fn answer(
    r: &Rig,
    model: &str,
    text: &str,
    headers: &[(&'static str, &str)],
) -> (HeaderMap, Value) {
    let (s, h, b) = call(&r.app, ask(model, text, headers)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    let content: Value =
        serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    (h, content)
}

fn tier(h: &HeaderMap) -> &str {
    h["x-tiergate-tier"].to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_question_again_is_an_exact_hit_with_the_fresh_verdict_and_streams_alike() {
    let r = rig(1, cached);
    let (h1, fresh) = answer(&r, "classify", "my card was lost", &[]).await;
    assert_eq!(tier(&h1), "llm");
    assert!(h1.get("x-tiergate-cache").is_none());
    // Spacing does not make another question (nor do case and punctuation, on an uncased encoder: with this
    // tiny cased one they change Tier-0's candidates, which are part of the key).
    let (h2, hit) = answer(&r, "classify", "  my card  was lost ", &[]).await;
    assert_eq!(tier(&h2), "cache", "{h2:?}");
    assert_eq!(h2["x-tiergate-cache"], "exact");
    assert_eq!(h2["x-tiergate-cache-similarity"], "1.0000");
    assert_eq!(h2["x-tiergate-stage"], h1["x-tiergate-stage"]);
    assert_eq!(h2["x-tiergate-backend"], h1["x-tiergate-backend"]);
    // The verdict is the fresh one: label, confidence and candidates (the scores fused anew with the same prior).
    assert_eq!(hit["label"], fresh["label"]);
    assert_eq!(hit["candidates"], fresh["candidates"]);
    assert_eq!(hit["tier"], "cache");
    // A hit streams as SSE like a fresh answer.
    let mut body = chat("classify", "my card was lost");
    body["stream"] = json!(true);
    let mut req = post("/v1/chat/completions", body);
    force(&mut req, "0");
    let (s, h, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(tier(&h), "cache");
    let text = String::from_utf8(b).unwrap();
    assert!(
        text.contains(&format!(
            "\"content\":\"{}\"",
            fresh["label"].as_str().unwrap()
        )),
        "{text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_keeps_nothing_and_no_cache_asks_the_llm() {
    let r = rig(1, cached);
    let (h, _) = answer(
        &r,
        "classify",
        "pay the bill",
        &[("cache-control", "no-store")],
    )
    .await;
    assert_eq!(tier(&h), "llm");
    let (h, _) = answer(&r, "classify", "pay the bill", &[]).await;
    assert_eq!(tier(&h), "llm", "no-store kept nothing");
    let (h, _) = answer(
        &r,
        "classify",
        "pay the bill",
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(tier(&h), "llm", "no-cache skips the lookup");
    let (h, _) = answer(&r, "classify", "pay the bill", &[]).await;
    assert_eq!(tier(&h), "cache");
    // DELETE /admin/cache drops it.
    let (s, _, b) = call(&r.admin, admin_req("DELETE", "/admin/cache", None)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(v["cleared"].as_u64().unwrap() >= 1, "{v}");
    let (h, _) = answer(&r, "classify", "pay the bill", &[]).await;
    assert_eq!(tier(&h), "llm", "cleared");
    let (s, _, b) = call(&r.admin, admin_req("GET", "/admin/cache", None)).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["entries"], 1, "{v}");
    assert!(v["guards_cover"].as_str().unwrap().starts_with("English"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_never_crosses_routes() {
    let r = rig(1, cached);
    let (h, _) = answer(&r, "classify", "card stolen", &[]).await;
    assert_eq!(tier(&h), "llm");
    // The answer route shares the head but not the route: another scope.
    let mut req = post("/v1/chat/completions", chat("answer", "card stolen"));
    force(&mut req, "0");
    let (s, h, _) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_ne!(tier(&h), "cache");
    let (h, _) = answer(&r, "classify", "card stolen", &[]).await;
    assert_eq!(tier(&h), "cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_is_not_served_after_its_ttl() {
    let r = rig(1, |c| {
        cached(c);
        c.cache.ttl_s = 1;
    });
    answer(&r, "classify", "hello hi there", &[]).await;
    let (h, _) = answer(&r, "classify", "hello hi there", &[]).await;
    assert_eq!(tier(&h), "cache");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (h, _) = answer(&r, "classify", "hello hi there", &[]).await;
    assert_eq!(tier(&h), "llm", "expired");
}

/// A hit runs no LLM job: it is served under brownout at `tier0_only` (where a miss degrades) and to a tenant
/// whose LLM budget is spent (where a miss degrades with `budget`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_are_served_under_brownout_and_over_budget() {
    let r = rig(1, |c| {
        cached(c);
        // Exact hits only: the tiny encoder puts unrelated texts at cosine > 0.9.
        c.cache.semantic = false;
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "300".into()];
        c.brownout.enabled = true;
        c.brownout.hold_ms = 0;
        c.tenants = vec![tiergate_config::TenantConfig {
            name: "metered".into(),
            key_sha256: digest("key-m"),
            // 0.5 LLM-seconds banked: two jobs of 300 ms spend it.
            llm_seconds_per_min: Some(0.5),
            ..Default::default()
        }];
    });
    let key = [("authorization", "Bearer key-m")];
    for text in ["card lost", "pay bill"] {
        let (h, _) = answer(&r, "classify", text, &key).await;
        assert_eq!(tier(&h), "llm");
    }
    let (h, _) = answer(&r, "classify", "hello hi", &key).await;
    assert_eq!(h["x-tiergate-degraded"], "budget", "{h:?}");
    let (h, _) = answer(&r, "classify", "card lost", &key).await;
    assert_eq!(
        tier(&h),
        "cache",
        "over budget, the cache still answers: {h:?}"
    );
    assert!(h.get("x-tiergate-degraded").is_none());
    // Under brownout.
    for _ in 0..4 {
        r.engine.observe_utilization(5.0);
    }
    assert_eq!(r.engine.brownout().as_str(), "tier0_only");
    let (h, _) = answer(&r, "classify", "pay bill", &key).await;
    assert_eq!(tier(&h), "cache", "{h:?}");
    assert_eq!(h["x-tiergate-brownout"], "tier0_only");
    let (h, _) = answer(&r, "classify", "something else entirely", &key).await;
    assert_eq!(
        h.get("x-tiergate-degraded").map(|v| v.to_str().unwrap()),
        Some("brownout"),
        "{h:?}"
    );
}

/// A hit counts in the routing policy's escalated share (the decision was to escalate; the cache made it
/// cost nothing), and stays out of the escalated latency the `slo` mode steers by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_counts_as_an_escalation_in_the_share() {
    let r = rig(1, |c| {
        cached(c);
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 0.0;
    });
    let plain = |text: &str| {
        let mut body = chat("classify", text);
        body["response_format"] = json!({"type": "json_object"});
        post("/v1/chat/completions", body)
    };
    let (_, h, _) = call(&r.app, plain("pay bill now")).await;
    assert_eq!(tier(&h), "llm");
    for _ in 0..3 {
        let (_, h, _) = call(&r.app, plain("pay bill now")).await;
        assert_eq!(tier(&h), "cache");
    }
    let (live, _) = r.engine.policy(&Default::default()).unwrap();
    assert_eq!(
        live["escalated_share_60s"], 1.0,
        "four decisions, four escalations"
    );
    // The console shows the cache's share of them.
    let (s, _, b) = call(&r.admin, admin_req("GET", "/admin/console", None)).await;
    assert_eq!(s, StatusCode::OK);
    let c = &serde_json::from_slice::<Value>(&b).unwrap()["cache"];
    assert_eq!(c["hits_recent"], 3, "{c}");
    assert_eq!(c["hit_share_recent"], 0.75, "{c}");
    assert_eq!(c["entries"], 1, "{c}");
}

/// `kind = "redis"` with Redis gone: every request is answered (the shared store is a miss, its write is
/// skipped), and this replica's own store still hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_gone_is_a_miss_never_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The port was free a moment ago and nothing listens on it now.
    let r = rig(1, |c| {
        cached(c);
        c.cache.kind = tiergate_config::CacheKind::Redis;
        c.cache.url = format!("redis://127.0.0.1:{port}/0");
    });
    let (h, _) = answer(&r, "classify", "card lost today", &[]).await;
    assert_eq!(tier(&h), "llm");
    let (h, _) = answer(&r, "classify", "card lost today", &[]).await;
    assert_eq!(tier(&h), "cache");
    let (h, _) = answer(&r, "classify", "pay the bill today", &[]).await;
    assert_eq!(tier(&h), "llm");
    assert_eq!(r.engine.cache_view()["shared_up"], false);
    // A clear the shared store never heard of is not reported as done: 503, saying what was cleared here.
    let (s, _, b) = call(&r.admin, admin_req("DELETE", "/admin/cache", None)).await;
    let v = assert_openai_error(s, &b, 503);
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("here") && m.contains("did not answer"),
        "Redis did not answer: {v}"
    );
}

/// The text an SSE body's chunks carry, joined.
fn sse_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// A chat request with `temperature`, θ forced to 0 (an answer route escalates), extra headers; the status,
/// headers and the reply's text.
async fn written(
    r: &Rig,
    model: &str,
    text: &str,
    temperature: f64,
    headers: &[(&'static str, &str)],
) -> (HeaderMap, String) {
    let mut body = chat(model, text);
    body["temperature"] = json!(temperature);
    let mut req = post("/v1/chat/completions", body);
    force(&mut req, "0");
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    let (s, h, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    (
        h,
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

/// LLM-written answers are cached only where the route says `cache_generations`, only at temperature 0, and
/// per tenant: one tenant's conversation never answers another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_answers_are_cached_at_temperature_0_per_tenant_where_the_route_allows() {
    let r = rig(1, |c| {
        cached(c);
        for route in c.routes.iter_mut().filter(|r| r.name == "answer") {
            route.cache_generations = true;
        }
        c.tenants = ["a", "b"]
            .iter()
            .map(|n| tiergate_config::TenantConfig {
                name: (*n).into(),
                key_sha256: digest(&format!("key-{n}")),
                ..Default::default()
            })
            .collect();
    });
    let (ka, kb) = (
        [("authorization", "Bearer key-a")],
        [("authorization", "Bearer key-b")],
    );
    let (h, fresh) = written(&r, "answer", "card lost", 0.0, &ka).await;
    assert_eq!(tier(&h), "llm");
    let (h, hit) = written(&r, "answer", "card lost", 0.0, &ka).await;
    assert_eq!(tier(&h), "cache", "{h:?}");
    assert_eq!(h["x-tiergate-cache"], "exact");
    assert_eq!(hit, fresh);
    let (h, _) = written(&r, "answer", "card lost", 0.0, &kb).await;
    assert_eq!(tier(&h), "llm", "another tenant's answer is not a hit");
    for _ in 0..2 {
        let (h, _) = written(&r, "answer", "pay bill", 0.7, &ka).await;
        assert_eq!(tier(&h), "llm", "not at temperature 0.7");
    }
    for _ in 0..2 {
        let (h, _) = written(&r, "generate", "hello there", 0.0, &ka).await;
        assert_eq!(tier(&h), "llm", "the generate route does not allow it");
    }
}

/// A generate route that allows it: a generation at temperature 0 is kept when it ends (streamed or not),
/// and a hit streams as SSE like a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_at_temperature_0_is_kept_when_it_ends_and_a_hit_streams() {
    let r = rig(1, |c| {
        cached(c);
        for route in c.routes.iter_mut().filter(|r| r.name == "generate") {
            route.cache_generations = true;
        }
    });
    // Kept from a stream.
    let mut body = chat("generate", "one two three");
    body["temperature"] = json!(0.0);
    body["stream"] = json!(true);
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body.clone())).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(tier(&h), "llm");
    let fresh = String::from_utf8(b).unwrap();
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(tier(&h), "cache", "{h:?}");
    let hit = String::from_utf8(b).unwrap();
    assert!(hit.contains("\"content\":\"stub: one two three\""), "{hit}");
    assert!(hit.trim_end().ends_with("data: [DONE]"), "{hit}");
    assert_eq!(
        sse_text(&fresh),
        sse_text(&hit),
        "the hit's text is the stream's, whole"
    );
    // The same question collected: the same text, from the cache.
    let (h, text) = written(&r, "generate", "one two three", 0.0, &[]).await;
    assert_eq!((tier(&h), text.as_str()), ("cache", "stub: one two three"));
    // no-store: a new question is not kept.
    let (h, _) = written(
        &r,
        "generate",
        "four five",
        0.0,
        &[("cache-control", "no-store")],
    )
    .await;
    assert_eq!(tier(&h), "llm");
    let (h, _) = written(&r, "generate", "four five", 0.0, &[]).await;
    assert_eq!(tier(&h), "llm");
}

/// Under brownout a generate route's generations are paused, but a kept one runs no LLM job: it is served
/// (marked with the step), and a new question is refused 429 `overloaded` with Retry-After as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_generation_is_served_while_generation_is_paused() {
    let r = rig(1, |c| {
        cached(c);
        for route in c.routes.iter_mut().filter(|r| r.name == "generate") {
            route.cache_generations = true;
        }
        c.brownout.enabled = true;
        c.brownout.hold_ms = 0;
    });
    let (h, fresh) = written(&r, "generate", "one two three", 0.0, &[]).await;
    assert_eq!(tier(&h), "llm");
    for _ in 0..4 {
        r.engine.observe_utilization(5.0);
    }
    assert_eq!(r.engine.brownout().as_str(), "tier0_only");
    let (h, hit) = written(&r, "generate", "one two three", 0.0, &[]).await;
    assert_eq!((tier(&h), hit.as_str()), ("cache", fresh.as_str()));
    assert_eq!(h["x-tiergate-brownout"], "tier0_only");
    let mut body = chat("generate", "a question never asked");
    body["temperature"] = json!(0.0);
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert!(h.contains_key("retry-after"), "{h:?}");
    assert_eq!(h["x-tiergate-brownout"], "tier0_only");
    let e: Value = serde_json::from_slice(&b).unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("generation is paused"),
        "{e}"
    );
}

/// A cached verdict is its tenant's: another tenant's same question goes to the LLM (no hit, no
/// `x-tiergate-cache` telling it someone asked), and its answer is cached for it alone; tenants an operator
/// puts in one `cache_group` share their verdicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_are_cached_per_tenant_unless_a_cache_group_shares_them() {
    let r = rig(1, |c| {
        cached(c);
        c.tenants = [
            ("a", None),
            ("b", None),
            ("d", Some("team")),
            ("e", Some("team")),
        ]
        .iter()
        .map(|(n, group)| tiergate_config::TenantConfig {
            name: (*n).into(),
            key_sha256: digest(&format!("key-{n}")),
            cache_group: group.map(str::to_string),
            ..Default::default()
        })
        .collect();
    });
    let key = |n: &str| [("authorization", format!("Bearer key-{n}"))];
    let ask_as = |n: &'static str, text: &'static str| {
        let r = &r;
        async move {
            let k = key(n);
            let h: Vec<(&'static str, &str)> = k.iter().map(|(a, b)| (*a, b.as_str())).collect();
            answer(r, "classify", text, &h).await.0
        }
    };
    let h = ask_as("a", "my card was lost").await;
    assert_eq!(tier(&h), "llm");
    assert_eq!(tier(&ask_as("a", "my card was lost").await), "cache");
    let h = ask_as("b", "my card was lost").await;
    assert_eq!(tier(&h), "llm", "another tenant's verdict is no hit: {h:?}");
    assert!(h.get("x-tiergate-cache").is_none());
    assert_eq!(
        tier(&ask_as("b", "my card was lost").await),
        "cache",
        "its own is"
    );
    // One group: what d asked answers e.
    assert_eq!(tier(&ask_as("d", "my card was lost").await), "llm");
    let h = ask_as("e", "my card was lost").await;
    assert_eq!(tier(&h), "cache", "{h:?}");
    assert_eq!(h["x-tiergate-cache"], "exact");
}
