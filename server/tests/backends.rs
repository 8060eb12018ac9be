//! The LLM backends as the server sees them: every one is seen, not only the first (an `[[llm]]` entry's own
//! `candidates`, each stage's policy fed its own backends' utilisation, the brownout ladder moved by a
//! saturated second stage and by real load up to `shed`, `/ready` judged on the backends a generate route
//! uses, stages named apart); a cascade of stages, a stage's alternatives, retries and fallback, the circuit
//! breaker. The real router and state, stub worker processes behind the real shared-memory queue
//! (`common::rig`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tiergate_config::{Config, LlmEntry, StageConfig, StageTable};

mod common;
use common::rig::{
    admin, admin_req, assert_openai_error, call, chat, force, post, rig, Rig, TOKEN,
};

fn entry(name: &str, fields: &str) -> LlmEntry {
    LlmEntry {
        name: name.into(),
        fields: toml::from_str(fields).unwrap(),
    }
}

/// Waits until backend `i` has a live worker.
fn live(r: &Rig, i: usize) {
    let t = Instant::now();
    while r.engine.readiness().1["backends"][i]["live_workers"] == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "backend {i} never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn escalate(text: &str) -> Request<Body> {
    let mut req = post("/v1/chat/completions", chat("classify", text));
    force(&mut req, "0");
    req
}

async fn routing(r: &Rig, query: &str) -> Value {
    let req = Request::get(format!("/admin/routing{query}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (s, _, b) = call(&r.admin, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    serde_json::from_slice(&b).unwrap()
}

/// `[reranker] candidates = 2`, the one `[[llm]]` entry's `candidates = 1`: the rerank gets one candidate (the
/// escalation record shows what the LLM was given).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_entry_reranks_its_own_number_of_candidates() {
    let rec = tempfile::tempdir().unwrap();
    let path = rec.path().join("escalations.jsonl");
    let p = path.clone();
    let r = rig(1, move |c: &mut Config| {
        c.reranker.candidates = 2;
        c.llm = vec![entry(
            "solo",
            "engine = \"stub\"\nworkers = 1\ncandidates = 1",
        )];
        c.server.record_escalations = Some(p);
    });
    live(&r, 0);
    let (s, h, _) = call(&r.app, escalate("card lost")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-tiergate-tier"], "llm");
    let t = Instant::now();
    let line = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(l) = text.lines().next() {
            break l.to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no escalation record");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["candidates"].as_array().unwrap().len(), 1, "{v}");
}

/// A cascade "small" → "big" where only the big stage is loaded (one slot, each rerank 1.5 s, three requests
/// at once): its own policy reads its workers busy while the routing policy, fed by the first stage's
/// backend, reads them idle; and the brownout ladder, fed by every backend's queue, leaves `normal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_second_stage_moves_its_own_policy_and_the_brownout_ladder() {
    let r = Arc::new(rig(1, |c: &mut Config| {
        c.llm = vec![
            entry("small", "engine = \"stub\"\nworkers = 1"),
            entry(
                "big",
                "engine = \"stub\"\nworkers = 1\nmax_concurrent = 1\nmax_in_flight = 3\n\
                 rerank_deadline_ms = 20000\nextra_args = [\"--stub-delay-ms\", \"1500\"]",
            ),
        ];
        c.routing.utilization_source = tiergate_config::UtilizationSource::Workers;
        c.brownout.enabled = true;
        c.brownout.hold_ms = 200;
        let policy = tiergate_config::RoutingConfig {
            mode: tiergate_config::RoutingMode::Load,
            theta_base: 0.0,
            k: 0.0,
            utilization_source: tiergate_config::UtilizationSource::Workers,
            ..Default::default()
        };
        for route in c.routes.iter_mut().filter(|r| r.name == "classify") {
            route.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Table(StageTable {
                    llm: Some("big".into()),
                    policy: Some(policy.clone()),
                    ..Default::default()
                }),
            ]);
        }
    }));
    live(&r, 0);
    live(&r, 1);
    // The sampler among the engine's background tasks.
    r.engine.start();
    let load: Vec<_> = (0..3)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { call(&r.app, escalate("card lost")).await })
        })
        .collect();
    let t = Instant::now();
    let (mut stage_u, mut routing_u, mut step) = (0.0, 1.0, "normal".to_string());
    while t.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let stage = routing(&r, "?route=classify&stage=big").await;
        let top = routing(&r, "").await;
        stage_u = f64::max(stage_u, stage["utilization"].as_f64().unwrap());
        routing_u = top["utilization"].as_f64().unwrap();
        if r.engine.brownout() > tiergate_engine::model::outcome::Step::Normal {
            step = r.engine.brownout().as_str().to_string();
        }
    }
    assert!(
        stage_u > 0.3,
        "the big stage's policy reads its busy workers: {stage_u}"
    );
    assert!(
        routing_u < 0.2,
        "the routing policy reads the first stage's idle workers: {routing_u}"
    );
    assert_ne!(
        step, "normal",
        "two of three waiting on the big stage's queue moves the ladder"
    );
    for l in load {
        let (s, _, _) = l.await.unwrap();
        assert_eq!(s, StatusCode::OK);
    }
}

/// `/ready` asks of every generate route a live worker among its first stage's backends, whichever backend
/// comes first: a generate route on a backend whose workers never start is not served (503), though the
/// first backend is live; a classify-only server on it stays ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_looks_at_the_backends_a_generate_route_uses() {
    let cascade = |generate: bool| {
        move |c: &mut Config| {
            c.llm = vec![
                entry("up", "engine = \"stub\"\nworkers = 1"),
                entry(
                    "down",
                    "engine = \"stub\"\nworkers = 1\nextra_args = [\"--no-such-flag\"]",
                ),
            ];
            c.routes.retain(|r| generate || r.name != "generate");
            for route in c.routes.iter_mut().filter(|r| r.name == "generate") {
                route.stages = Some(vec![StageConfig::Name("down".into())]);
            }
        }
    };
    let ready = |r: &Rig| {
        let r = r.app.clone();
        async move {
            let (s, _, b) = call(&r, Request::get("/ready").body(Body::empty()).unwrap()).await;
            (s, serde_json::from_slice::<Value>(&b).unwrap())
        }
    };
    let r = rig(1, cascade(true));
    live(&r, 0);
    let (s, v) = ready(&r).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["unserved_routes"], json!(["generate"]), "{v}");
    assert_eq!(v["backends"][0]["live_workers"], 1, "{v}");
    assert_eq!(v["backends"][1]["live_workers"], 0, "{v}");
    drop(r);
    let r = rig(1, cascade(false));
    live(&r, 0);
    let (s, v) = ready(&r).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// Two stages of one route starting with the same backend would share one policy (and one Redis key): the
/// config is refused unless they are named apart, and then each has its own policy.
#[test]
fn stages_are_named_apart_or_refused() {
    let tiny = tiergate_prefilter::testing::TinyModel::create(2).unwrap();
    let mut c = common::config(&tiny);
    c.llm = vec![
        entry("a", "engine = \"stub\"\nworkers = 0"),
        entry("b", "engine = \"stub\"\nworkers = 0"),
    ];
    let table = |name: Option<&str>, any: &[&str]| {
        StageConfig::Table(StageTable {
            name: name.map(str::to_string),
            any: Some(any.iter().map(|s| s.to_string()).collect()),
            theta: Some(0.5),
            ..Default::default()
        })
    };
    let route = c.routes.iter().position(|r| r.name == "classify").unwrap();
    c.routes[route].stages = Some(vec![
        StageConfig::Name("a".into()),
        table(None, &["b"]),
        table(None, &["b", "a"]),
    ]);
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("two stages named `b`") && err.contains("stages[2].name"),
        "{err}"
    );
    c.routes[route].stages = Some(vec![
        StageConfig::Name("a".into()),
        table(None, &["b"]),
        table(Some("b-then-a"), &["b", "a"]),
    ]);
    c.validate().unwrap();
    let engine = tiergate_engine::Engine::build(c, None, None, None).unwrap();
    let stages = engine.console()["stages"].clone();
    let names: Vec<&str> = stages
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|rp| rp["stage"].as_str())
        .collect();
    assert_eq!(names, ["b", "b-then-a"]);
}

/// The brownout ladder driven by real load, no manual utilisation: four slow escalations (6 s) hold the server's
/// whole admission limit (its own in-flight share 1.0) and the ladder climbs step by step to `shed`, where a
/// new chat request — admitted, the load gone — gets the shed step's 429 with `Retry-After` and
/// `x-tiergate-brownout: shed`, until the ladder cools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_load_climbs_the_brownout_ladder_to_shed_and_its_429() {
    let r = Arc::new(rig(1, |c: &mut Config| {
        c.server.max_in_flight = 4;
        c.reranker.max_concurrent = 4;
        c.reranker.rerank_deadline_ms = 20_000;
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "6000".into()];
        c.routing.utilization_source = tiergate_config::UtilizationSource::Workers;
        c.brownout.enabled = true;
        c.brownout.enter = [0.3, 0.5, 0.7];
        c.brownout.leave = [0.1, 0.2, 0.25];
        c.brownout.hold_ms = 100;
        c.brownout.cool_ms = 30_000;
        c.brownout.p95_limit_ms = 60_000;
    }));
    live(&r, 0);
    // The sampler among the engine's background tasks.
    r.engine.start();
    let load: Vec<_> = (0..4)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { call(&r.app, escalate("card lost")).await })
        })
        .collect();
    let t = Instant::now();
    let mut seen = Vec::new();
    // The sampler reads every 500 ms and a step needs two readings over its threshold (`hold_ms` apart).
    while t.elapsed() < Duration::from_millis(5500) && seen.last() != Some(&"shed") {
        let step = r.engine.brownout().as_str();
        if seen.last() != Some(&step) {
            seen.push(step);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen,
        ["normal", "rerank_only", "tier0_only", "shed"],
        "one step at a time, on the server's own load"
    );
    for l in load {
        let (s, _, _) = l.await.unwrap();
        assert_eq!(
            s,
            StatusCode::OK,
            "work admitted before the shed step finishes"
        );
    }
    // The load is gone and admission is free; the ladder holds `shed` until it cools.
    let (s, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    let v = assert_openai_error(s, &b, 429);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("brownout step `shed`"),
        "{v}"
    );
    assert!(h.contains_key("retry-after"));
    assert_eq!(h["x-tiergate-brownout"], "shed");
}

/// Waits (≤ 10 s) until every backend of `r` has a live worker.
fn all_live(r: Rig) -> Rig {
    let t = Instant::now();
    let starting = |r: &Rig| {
        let (_, ready) = r.engine.readiness();
        ready["backends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["live_workers"] == 0)
    };
    while starting(&r) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a backend never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    r
}

/// A config tweak: the backends `llm`, and one stage (`stage`, a TOML stage table) on the routes `which` names.
fn with_stage(
    llm: Vec<tiergate_config::LlmEntry>,
    stage: &str,
    which: impl Fn(&str) -> bool,
) -> impl FnOnce(&mut Config) {
    let stage: tiergate_config::StageTable = toml::from_str(stage).unwrap();
    move |c: &mut Config| {
        c.llm = llm;
        for r in c.routes.iter_mut().filter(|r| which(&r.name)) {
            r.stages = Some(vec![tiergate_config::StageConfig::Table(stage.clone())]);
        }
    }
}

/// The circuit breaker: a backend whose every job fails (the stub answers garbage) opens it after
/// `breaker_failures` in a row; then escalations degrade at once (`breaker_open`) and generations get 503,
/// until after the cooldown one probe goes through (here it fails again: open again). `/ready` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_opens_the_breaker_and_a_probe_tries_it_again() {
    let r = rig(1, |c| {
        c.reranker.extra_args = vec!["--stub-garbage-every".into(), "1".into()];
        c.reranker.breaker_failures = 2;
        c.reranker.breaker_cooldown_ms = 500;
    });
    let ask = |model: &str| {
        let mut req = post("/v1/chat/completions", chat(model, "card lost"));
        force(&mut req, "0");
        req
    };
    let degraded = |h: &axum::http::HeaderMap| {
        h.get("x-tiergate-degraded")
            .map(|v| v.to_str().unwrap().to_string())
    };
    for _ in 0..2 {
        let (s, h, _) = call(&r.app, ask("classify")).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(degraded(&h).as_deref(), Some("llm_error"));
    }
    let (_, h, _) = call(&r.app, ask("classify")).await;
    assert_eq!(degraded(&h).as_deref(), Some("breaker_open"));
    let (s, h, b) = call(&r.app, ask("generate")).await;
    assert_openai_error(s, &b, 503);
    assert!(h.contains_key("retry-after"));
    assert_eq!(r.engine.console()["breaker"], "open");
    let (s, _, _) = call(&r.app, Request::get("/ready").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK, "Tier-0 still serves");
    // After the cooldown: one probe reaches the backend (and fails), then it is open again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (_, h, _) = call(&r.app, ask("classify")).await;
    assert_eq!(degraded(&h).as_deref(), Some("llm_error"), "the probe ran");
    let (_, h, _) = call(&r.app, ask("classify")).await;
    assert_eq!(degraded(&h).as_deref(), Some("breaker_open"));
}

/// A cascade of two LLM backends (`[[llm]]` "small" and "big", both stub worker processes): an escalation goes
/// to the first stage; it goes on to the second while the fused ambiguity is above that stage's θ
/// (`x-tiergate-backend` says which answered); with a second stage that keeps failing, the first stage's
/// answer stands, degraded with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_goes_on_while_unsure_and_keeps_the_earlier_answer_when_a_stage_fails() {
    let entry = |name: &str, fields: &str| tiergate_config::LlmEntry {
        name: name.into(),
        fields: toml::from_str(fields).unwrap(),
    };
    let cascade = |theta: f64, big: &str| {
        let big = big.to_string();
        move |c: &mut Config| {
            c.llm = vec![
                entry("small", "engine = \"stub\"\nworkers = 1"),
                entry("big", &format!("engine = \"stub\"\nworkers = 1\n{big}")),
            ];
            for r in c.routes.iter_mut().filter(|r| r.name == "classify") {
                r.stages = Some(vec![
                    tiergate_config::StageConfig::Name("small".into()),
                    tiergate_config::StageConfig::Table(tiergate_config::StageTable {
                        llm: Some("big".into()),
                        theta: Some(theta),
                        ..Default::default()
                    }),
                ]);
            }
        }
    };
    let ask = || {
        let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
        force(&mut req, "0");
        req
    };
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    // θ 0 on the big stage: any ambiguity left goes on to it.
    let r = all_live(rig(1, cascade(0.0, "")));
    assert_eq!(r.engine.info()["backends"], json!(["small", "big"]));
    let (s, h, b) = call(&r.app, ask()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(header(&h, "x-tiergate-tier").as_deref(), Some("llm"));
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("big"));
    drop(r);
    // θ 1: the small stage's answer is sure enough.
    let r = all_live(rig(1, cascade(1.0, "")));
    let (_, h, _) = call(&r.app, ask()).await;
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("small"));
    // The big stage's own policy, changed live: θ 0 sends the next request on.
    let stage_admin = |method: &str, query: &str, body: Option<Value>| {
        let mut req = admin(method, body, true, None);
        *req.uri_mut() = format!("/admin/routing{query}").parse().unwrap();
        req
    };
    let (s, _, b) = call(
        &r.admin,
        stage_admin("GET", "?route=classify&stage=big", None),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["theta_base"].as_f64()),
        (Some("static"), Some(1.0))
    );
    let (s, _, b) = call(
        &r.admin,
        stage_admin(
            "PATCH",
            "?route=classify&stage=big",
            Some(json!({"theta_base": 0.0})),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (_, h, _) = call(&r.app, ask()).await;
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("big"));
    // The routing policy itself is untouched; a half-named or unknown stage is refused.
    let (_, _, b) = call(&r.admin, stage_admin("GET", "", None)).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["mode"], "load");
    // A route alone names a steered route's own policy: this one has none.
    let (s, _, b) = call(&r.admin, stage_admin("GET", "?route=classify", None)).await;
    assert_openai_error(s, &b, 404);
    let (s, _, b) = call(
        &r.admin,
        stage_admin("GET", "?route=classify&stage=small", None),
    )
    .await;
    assert_openai_error(s, &b, 404);
    drop(r);
    // The big stage answers garbage: the small stage's answer stands, degraded.
    let r = all_live(rig(
        1,
        cascade(0.0, "extra_args = [\"--stub-garbage-every\", \"1\"]"),
    ));
    let (s, h, b) = call(&r.app, ask()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(header(&h, "x-tiergate-tier").as_deref(), Some("llm"));
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("small"));
    assert_eq!(
        header(&h, "x-tiergate-degraded").as_deref(),
        Some("llm_error")
    );
}

/// Within a stage: alternatives chosen by predicted completion (`prefer = "latency"` follows the measured
/// service times; a budget too short for one picks the other whatever the preference), a failed alternative
/// falls back to the next, and `retries` runs a job again on the same backend after an engine error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_picks_the_alternative_that_fits_and_retries_or_falls_back() {
    let entry = |name: &str, fields: &str| tiergate_config::LlmEntry {
        name: name.into(),
        fields: toml::from_str(&format!(
            "engine = \"stub\"\nworkers = 1\nrerank_prior_ms = 100\n{fields}"
        ))
        .unwrap(),
    };
    let with_stage = |llm, stage: &str| with_stage(llm, stage, |r| r == "classify");
    let ask = |budget: Option<&str>| {
        let mut req = post("/v1/chat/completions", chat("classify", "card lost"));
        force(&mut req, "0");
        if let Some(b) = budget {
            req.headers_mut()
                .insert("x-tiergate-deadline-ms", b.parse().unwrap());
        }
        req
    };
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    let slow = "extra_args = [\"--stub-delay-ms\", \"600\"]";
    let fast = "extra_args = [\"--stub-delay-ms\", \"20\"]";
    // Latency: once measured, the fast one; its P95 is what decides.
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("slow", slow), entry("fast", fast)],
            "any = [\"slow\", \"fast\"]\nprefer = \"latency\"",
        ),
    ));
    let mut by = Vec::new();
    for _ in 0..12 {
        let (_, h, _) = call(&r.app, ask(None)).await;
        by.push(header(&h, "x-tiergate-backend").unwrap_or_default());
    }
    assert!(by[6..].iter().all(|b| b == "fast"), "{by:?}");
    drop(r);
    // Quality prefers the first listed, until a budget leaves no room for it.
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("slow", slow), entry("fast", fast)],
            "any = [\"slow\", \"fast\"]\nprefer = \"quality\"",
        ),
    ));
    for _ in 0..4 {
        let (_, h, _) = call(&r.app, ask(None)).await;
        assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("slow"));
    }
    let (_, h, _) = call(&r.app, ask(Some("300"))).await;
    assert_eq!(
        header(&h, "x-tiergate-backend").as_deref(),
        Some("fast"),
        "600 ms does not fit 300"
    );
    // The stage is named after its first alternative, whichever of them answered (the metric's `stage` label
    // and the stage policy's key); the response says both.
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("slow"));
    drop(r);
    // A broken first alternative falls back to the next.
    let broken = "extra_args = [\"--stub-garbage-every\", \"1\"]";
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("broken", broken), entry("fast", fast)],
            "any = [\"broken\", \"fast\"]",
        ),
    ));
    let (_, h, _) = call(&r.app, ask(None)).await;
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("fast"));
    assert!(h.get("x-tiergate-degraded").is_none());
    drop(r);
    // Every second job fails: one retry on the same backend answers every request (silver: 1 retry).
    let flaky = "extra_args = [\"--stub-garbage-every\", \"2\"]";
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("flaky", flaky)],
            "llm = \"flaky\"\ngrade = \"silver\"",
        ),
    ));
    for _ in 0..4 {
        let (_, h, _) = call(&r.app, ask(None)).await;
        assert_eq!(header(&h, "x-tiergate-tier").as_deref(), Some("llm"));
        assert!(h.get("x-tiergate-degraded").is_none());
    }
}

/// Generations (generate and answer routes) choose and retry like reranks, but only before their first byte:
/// a broken alternative falls back to the next, a flaky one is retried (silver: 1 retry), and a stream that
/// breaks after its first token is this backend's answer — the client gets the error in the stream, no
/// second generation is started on the same or another backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_is_retried_or_moved_only_before_its_first_byte() {
    let entry = |name: &str, fields: &str| tiergate_config::LlmEntry {
        name: name.into(),
        fields: toml::from_str(&format!("engine = \"stub\"\nworkers = 1\n{fields}")).unwrap(),
    };
    let with_stage = |llm, stage: &str| with_stage(llm, stage, |r| r != "classify");
    let ask = |model: &str, stream: bool| {
        let mut body = chat(model, "card lost");
        body["stream"] = json!(stream);
        let mut req = post("/v1/chat/completions", body);
        force(&mut req, "0");
        req
    };
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    let broken = "extra_args = [\"--stub-garbage-every\", \"1\"]";
    let fast = "extra_args = [\"--stub-delay-ms\", \"20\"]";
    // A broken first alternative: both routes' generations come from the next one.
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("broken", broken), entry("fast", fast)],
            "any = [\"broken\", \"fast\"]",
        ),
    ));
    for model in ["generate", "answer"] {
        let (s, h, b) = call(&r.app, ask(model, false)).await;
        assert_eq!(
            s,
            StatusCode::OK,
            "{model}: {}",
            String::from_utf8_lossy(&b)
        );
        assert_eq!(
            header(&h, "x-tiergate-backend").as_deref(),
            Some("fast"),
            "{model}"
        );
        assert_eq!(
            header(&h, "x-tiergate-tier").as_deref(),
            Some("llm"),
            "{model}"
        );
    }
    drop(r);
    // Every second job fails before its first token: one retry answers every generation.
    let flaky = "extra_args = [\"--stub-garbage-every\", \"2\"]";
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("flaky", flaky)],
            "llm = \"flaky\"\ngrade = \"silver\"",
        ),
    ));
    for _ in 0..4 {
        let (s, _, b) = call(&r.app, ask("generate", false)).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    }
    drop(r);
    // A stream that breaks after its first token: no retry, no switch (2 retries and a healthy alternative
    // are there): one generation's tokens, then the error, in the one stream.
    let r = all_live(rig(
        1,
        with_stage(
            vec![
                entry("midway", "extra_args = [\"--stub-fail-mid-stream\"]"),
                entry("fast", fast),
            ],
            "any = [\"midway\", \"fast\"]\nretries = 2",
        ),
    ));
    let (s, h, b) = call(&r.app, ask("generate", true)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("midway"));
    let body = String::from_utf8_lossy(&b);
    assert_eq!(
        body.matches("stub:").count(),
        1,
        "one generation only: {body}"
    );
    assert!(
        body.contains("error"),
        "the failure is in the stream: {body}"
    );
}

/// A generate route steered by Tier-0 (`steer`): a sure label goes to the stage its map names, an unsure one
/// or an unmapped label to the default (the last stage), and the response names the stage and backend; a map
/// naming a label the head does not have, a stage the route does not have, or a classify route is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steered_generate_route_sends_sure_labels_to_their_stage() {
    let steered = |theta: f64, map: &'static str| {
        move |c: &mut Config| {
            c.llm = vec![
                entry("small", "engine = \"stub\"\nworkers = 1"),
                entry("big", "engine = \"stub\"\nworkers = 1"),
            ];
            for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
                r.stages = Some(vec![
                    tiergate_config::StageConfig::Name("small".into()),
                    tiergate_config::StageConfig::Name("big".into()),
                ]);
                r.steer = Some(toml::from_str(&format!("theta = {theta}\n{map}")).unwrap());
            }
        }
    };
    let ask = |text: &str| post("/v1/chat/completions", chat("generate", text));
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    // θ 1: every label counts as sure.
    let r = all_live(rig(1, steered(1.0, "[by_label]\ncard_lost = \"small\"")));
    let (s, h, b) = call(&r.app, ask("card lost")).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("small"));
    assert_eq!(header(&h, "x-tiergate-backend").as_deref(), Some("small"));
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("stub:"));
    // A label the map does not name: the default stage (the last).
    let (_, h, _) = call(&r.app, ask("pay bill")).await;
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("big"));
    drop(r);
    // θ 0: no label is sure; `"*"` names the default.
    let r = all_live(rig(
        1,
        steered(0.0, "[by_label]\ncard_lost = \"small\"\n\"*\" = \"big\""),
    ));
    let (_, h, _) = call(&r.app, ask("card lost")).await;
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("big"));
    drop(r);
    // Refused at start: a label the head does not have, a stage the route does not have.
    for map in [
        "[by_label]\nno_such_label = \"small\"",
        "[by_label]\ncard_lost = \"no_such_stage\"",
    ] {
        let tiny = tiergate_prefilter::testing::TinyModel::create(2).unwrap();
        let mut cfg = common::config(&tiny);
        cfg.reranker.engine = tiergate_config::EngineKind::Stub;
        steered(1.0, map)(&mut cfg);
        let built = tiergate_engine::Engine::build(cfg, None, Some(common::worker_program()), None);
        let e = format!("{:#}", built.err().expect(map));
        assert!(
            e.contains("no_such_label") || e.contains("no_such_stage"),
            "{map}: {e}"
        );
    }
}

/// A steered route's θ is its own live policy: `/admin/routing?route=generate` reads and changes it (θ 0: no
/// label is sure, the default stage; θ 1 again: the mapped stage), the console lists it; a route with no
/// policy of its own is 404, a `stage` without its route 400. A sure label's overrides shape its job: its
/// `max_tokens` caps the echo, its system prompt is counted in the prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steered_routes_theta_is_a_live_policy_and_a_labels_overrides_shape_its_job() {
    let r = all_live(rig(1, |c: &mut Config| {
        c.llm = vec![
            entry("small", "engine = \"stub\"\nworkers = 1"),
            entry("big", "engine = \"stub\"\nworkers = 1"),
        ];
        for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
            r.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Name("big".into()),
            ]);
            r.steer = Some(
                toml::from_str(
                    "theta = 1.0\n[by_label]\ncard_lost = \"small\"\n\
                     [overrides.card_lost]\nsystem = \"Answer in two words please.\"\nmax_tokens = 2\n",
                )
                .unwrap(),
            );
        }
    }));
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    let ask = |text: &str| post("/v1/chat/completions", chat("generate", text));
    let (s, h, b) = call(&r.app, ask("card lost")).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("small"));
    let v: Value = serde_json::from_slice(&b).unwrap();
    // The override's max_tokens (2): "stub:" and the first word; its system prompt's 5 words before the turn's 2.
    assert_eq!(v["choices"][0]["message"]["content"], "stub: card");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 7, "{v}");
    // The route's policy, live.
    let v = routing(&r, "?route=generate").await;
    assert_eq!(
        (v["mode"].as_str(), v["theta_eff"].as_f64()),
        (Some("static"), Some(1.0))
    );
    let patch = |theta: f64| {
        admin_req(
            "PATCH",
            "/admin/routing?route=generate",
            Some(json!({ "theta_base": theta })),
        )
    };
    let (s, _, b) = call(&r.admin, patch(0.0)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(routing(&r, "?route=generate").await["version"], 2);
    let (_, h, b) = call(&r.app, ask("card lost")).await;
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("big"));
    assert_eq!(
        header(&h, "x-tiergate-threshold").as_deref(),
        Some("0.0000")
    );
    // Not sure: no override — the whole echo.
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "stub: card lost");
    call(&r.admin, patch(1.0)).await;
    let (_, h, _) = call(&r.app, ask("card lost")).await;
    assert_eq!(header(&h, "x-tiergate-stage").as_deref(), Some("small"));
    // The console lists it beside the stage policies, with its share sent to the default stage.
    let (_, _, b) = call(&r.admin, admin_req("GET", "/admin/console", None)).await;
    let console: Value = serde_json::from_slice(&b).unwrap();
    let mine = console["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["route"] == "generate" && s["stage"].is_null())
        .cloned()
        .unwrap_or_else(|| panic!("{}", console["stages"]));
    assert_eq!(mine["version"], 3);
    assert!((mine["escalated_share_60s"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9);
    // What is not a route's own policy.
    let (s, _, b) = call(
        &r.admin,
        admin_req("GET", "/admin/routing?route=classify", None),
    )
    .await;
    assert_openai_error(s, &b, 404);
    let (s, _, b) = call(&r.admin, admin_req("GET", "/admin/routing?stage=big", None)).await;
    assert_openai_error(s, &b, 400);
    // A steered route's policy takes no error bound.
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "PATCH",
            "/admin/routing?route=generate",
            Some(json!({"mode": "risk", "max_error": 0.1})),
        ),
    )
    .await;
    assert_openai_error(s, &b, 400);
}

/// A session (`x-session-id`) stays with the backend of its last turn: a first turn under a 300 ms budget
/// goes to the fast alternative (the slow one does not fit) and pins it; later turns without a budget stay
/// there although the stage prefers the slow one, while a request without the session goes to the slow one.
/// A pin never overrides the budget: the session pinned to the slow one moves when a turn's budget rules it
/// out. On a steered route each genuine user turn goes to the stage Tier-0 steers it to: one unsure turn takes
/// the session up, the next sure one back down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_with_its_backend_within_the_budget_and_follows_its_genuine_turns() {
    let entry = |name: &str, delay: u64| {
        tiergate_config::LlmEntry {
        name: name.into(),
        fields: toml::from_str(&format!(
            "engine = \"stub\"\nworkers = 1\ngenerate_prior_ms = {}\nextra_args = [\"--stub-delay-ms\", \"{delay}\"]",
            delay.max(100) * 2
        ))
        .unwrap(),
    }
    };
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("slow", 600), entry("fast", 20)],
            "any = [\"slow\", \"fast\"]\nprefer = \"quality\"",
            |r| r == "generate",
        ),
    ));
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    let ask = |session: Option<&str>, budget: Option<&str>| {
        let mut req = post("/v1/chat/completions", chat("generate", "hello"));
        for (k, v) in [
            ("x-session-id", session),
            ("x-tiergate-deadline-ms", budget),
        ] {
            if let Some(v) = v {
                req.headers_mut().insert(k, v.parse().unwrap());
            }
        }
        req
    };
    let turn = |session, budget| {
        let req = ask(session, budget);
        let app = r.app.clone();
        async move {
            let (s, h, b) = call(&app, req).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            (
                header(&h, "x-tiergate-backend"),
                header(&h, "x-tiergate-session"),
            )
        }
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(turn(Some("a"), Some("300")).await, (s("fast"), s("new")));
    for _ in 0..3 {
        assert_eq!(turn(Some("a"), None).await, (s("fast"), s("kept")));
    }
    assert_eq!(turn(None, None).await, (s("slow"), None));
    // Pinned to the slow one; a turn whose budget it cannot meet moves, and the pin follows.
    assert_eq!(turn(Some("b"), None).await, (s("slow"), s("new")));
    assert_eq!(
        turn(Some("b"), Some("300")).await,
        (s("fast"), s("switched"))
    );
    assert_eq!(turn(Some("b"), None).await, (s("fast"), s("kept")));
    assert_eq!(r.engine.console()["sessions"], 2);
    drop(r);
    // A pinned backend that fails: the turn goes on to the next alternative and the pin follows it.
    let flaky = tiergate_config::LlmEntry {
        name: "flaky".into(),
        fields: toml::from_str(
            "engine = \"stub\"\nworkers = 1\ngenerate_prior_ms = 100\nbreaker_failures = 1\n\
             extra_args = [\"--stub-garbage-every\", \"2\"]",
        )
        .unwrap(),
    };
    let r = all_live(rig(
        1,
        with_stage(
            vec![flaky, entry("fast", 20)],
            "any = [\"flaky\", \"fast\"]\nprefer = \"quality\"",
            |r| r == "generate",
        ),
    ));
    let turn = |session| {
        let req = ask(session, None);
        let app = r.app.clone();
        async move {
            let (s, h, b) = call(&app, req).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            (
                header(&h, "x-tiergate-backend"),
                header(&h, "x-tiergate-session"),
            )
        }
    };
    assert_eq!(turn(Some("e")).await, (s("flaky"), s("new")));
    assert_eq!(turn(Some("e")).await, (s("fast"), s("switched")));
    assert_eq!(turn(Some("e")).await, (s("fast"), s("kept")));
    // A bad session key is a 400 naming the header.
    let mut bad = ask(None, None);
    bad.headers_mut()
        .insert("x-session-id", "has space".parse().unwrap());
    let (st, _, b) = call(&r.app, bad).await;
    let v = assert_openai_error(st, &b, 400);
    assert_eq!(v["error"]["param"], "x-session-id");
    drop(r);

    // Steered: a sure label goes to the small stage, an unsure one to the big; a session that reached the
    // big stage on one unsure turn returns to the small one on its next sure turn.
    let r = all_live(rig(1, |c: &mut Config| {
        c.llm = vec![entry("small", 10), entry("big", 10)];
        for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
            r.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Name("big".into()),
            ]);
            r.steer =
                Some(toml::from_str("theta = 1.0\n[by_label]\ncard_lost = \"small\"").unwrap());
        }
    }));
    let steered = |session: &str, text: &str| {
        let mut req = post("/v1/chat/completions", chat("generate", text));
        req.headers_mut()
            .insert("x-session-id", session.parse().unwrap());
        let app = r.app.clone();
        async move {
            let (_, h, _) = call(&app, req).await;
            (
                header(&h, "x-tiergate-stage"),
                header(&h, "x-tiergate-session"),
            )
        }
    };
    assert_eq!(steered("c", "card lost").await, (s("small"), s("new")));
    assert_eq!(steered("c", "pay bill").await, (s("big"), s("up")));
    assert_eq!(steered("c", "card lost").await, (s("small"), s("down")));
    assert_eq!(steered("c", "card lost").await, (s("small"), s("kept")));
    // Another session is steered on its own.
    assert_eq!(steered("d", "card lost").await, (s("small"), s("new")));
}

/// Brownout on a steered route: the ladder follows the busiest backend, but it pauses generation only where
/// the stage is pressed too. The big backend (one slot, room for one waiting job) gets two slow generations:
/// one runs, one waits — its queue full, the ladder climbs to `rerank_only`. A request Tier-0 is sure of
/// still goes to the calm small stage and is written there; an unsure one, for the big stage, gets the
/// paused generation's 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brownout_pauses_the_busy_stage_not_the_calm_one() {
    let r = all_live(rig(1, |c: &mut Config| {
        c.llm = vec![
            entry("small", "engine = \"stub\"\nworkers = 1"),
            entry(
                "big",
                "engine = \"stub\"\nworkers = 1\nmax_concurrent = 1\nmax_in_flight = 2\ngenerate_prior_ms = 100\n\
                 extra_args = [\"--stub-delay-ms\", \"3000\"]",
            ),
        ];
        for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
            r.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Name("big".into()),
            ]);
            r.steer =
                Some(toml::from_str("theta = 1.0\n[by_label]\ncard_lost = \"small\"").unwrap());
        }
        c.brownout.enabled = true;
        c.brownout.hold_ms = 0;
    }));
    let ask = |text: &str| post("/v1/chat/completions", chat("generate", text));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let app = r.app.clone();
            tokio::spawn(async move { call(&app, ask("pay bill")).await })
        })
        .collect();
    let t = Instant::now();
    while r.engine.console()["backends"][1]["waiting"] == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no job waited on big");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..4 {
        r.engine.observe_utilization(0.0);
    }
    assert_eq!(r.engine.brownout().as_str(), "rerank_only");
    let (s, h, b) = call(&r.app, ask("card lost")).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-tiergate-stage"], "small");
    assert_eq!(h["x-tiergate-brownout"], "rerank_only");
    let (s, _, b) = call(&r.app, ask("pay bill")).await;
    let e = assert_openai_error(s, &b, 429);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("paused"),
        "{e}"
    );
    for job in busy {
        let (s, _, _) = job.await.unwrap();
        assert_eq!(s, StatusCode::OK);
    }
}

/// Every door names a session its own way: Chat Completions' `prompt_cache_key`, the session in Messages'
/// `metadata.user_id`, a Responses chain through `previous_response_id` (its first response's id, with
/// `[responses] store`). Each session's first turn is `new`, its next `kept` on the same backend although the
/// stage would choose another (a budget on the first turn sent it to the fast one). `user` is a session key
/// only where the operator says so (`sessions.user_is_session`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_door_names_its_session() {
    let entry = |name: &str, prior: u64| tiergate_config::LlmEntry {
        name: name.into(),
        fields: toml::from_str(&format!(
            "engine = \"stub\"\nworkers = 1\ngenerate_prior_ms = {prior}"
        ))
        .unwrap(),
    };
    // With the Responses store on (in memory), for the chain.
    let stage = with_stage(
        vec![entry("slow", 5000), entry("fast", 100)],
        "any = [\"slow\", \"fast\"]\nprefer = \"quality\"",
        |r| r == "generate",
    );
    let r = all_live(rig(1, |c: &mut Config| {
        stage(c);
        c.responses.store = true;
    }));
    let send = |uri: &str, body: Value, budget: bool| {
        let mut req = post(uri, body);
        if budget {
            req.headers_mut()
                .insert("x-tiergate-deadline-ms", "1000".parse().unwrap());
        }
        req.headers_mut()
            .insert("anthropic-version", "2023-06-01".parse().unwrap());
        let app = r.app.clone();
        async move {
            let (s, h, b) = call(&app, req).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            let get = |k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
            let v: Value = serde_json::from_slice(&b).unwrap();
            (get("x-tiergate-backend"), get("x-tiergate-session"), v)
        }
    };
    let s = |v: &str| Some(v.to_string());
    let chat_turn = json!({"model": "generate", "prompt_cache_key": "pc-1", "messages": [{"role": "user", "content": "hi"}]});
    let (b, p, _) = send("/v1/chat/completions", chat_turn.clone(), true).await;
    assert_eq!((b, p), (s("fast"), s("new")));
    let (b, p, _) = send("/v1/chat/completions", chat_turn, false).await;
    assert_eq!((b, p), (s("fast"), s("kept")));
    let message = json!({"model": "generate", "max_tokens": 8, "metadata": {"user_id": "{\"session_id\":\"s-2\"}"},
                         "messages": [{"role": "user", "content": "hi"}]});
    let (b, p, _) = send("/v1/messages", message.clone(), true).await;
    assert_eq!((b, p), (s("fast"), s("new")));
    let (b, p, _) = send("/v1/messages", message, false).await;
    assert_eq!((b, p), (s("fast"), s("kept")));
    let (b, p, first) = send(
        "/v1/responses",
        json!({"model": "generate", "input": "hi"}),
        true,
    )
    .await;
    assert_eq!((b, p), (s("fast"), s("new")));
    let id = first["id"].as_str().unwrap();
    let (b, p, second) = send(
        "/v1/responses",
        json!({"model": "generate", "input": "again", "previous_response_id": id}),
        false,
    )
    .await;
    assert_eq!((b, p), (s("fast"), s("kept")));
    // The chain's third response is still the first one's session.
    let (b, p, _) = send(
        "/v1/responses",
        json!({"model": "generate", "input": "and again", "previous_response_id": second["id"]}),
        false,
    )
    .await;
    assert_eq!((b, p), (s("fast"), s("kept")));
    // Without a key, a plain chat turn is not pinned: the stage's own choice. Nor is one with only a `user`.
    let (b, p, _) = send(
        "/v1/chat/completions",
        json!({"model": "generate", "messages": [{"role": "user", "content": "hi"}]}),
        false,
    )
    .await;
    assert_eq!((b, p), (s("slow"), None));
    let by_user = json!({"model": "generate", "user": "u-1", "messages": [{"role": "user", "content": "hi"}]});
    let (b, p, _) = send("/v1/chat/completions", by_user.clone(), true).await;
    assert_eq!((b, p), (s("fast"), None));
    drop(r);
    let stage = with_stage(
        vec![entry("slow", 5000), entry("fast", 100)],
        "any = [\"slow\", \"fast\"]\nprefer = \"quality\"",
        |r| r == "generate",
    );
    let r = all_live(rig(1, |c: &mut Config| {
        stage(c);
        c.sessions.user_is_session = true;
    }));
    let send = |body: Value, budget: bool| {
        let mut req = post("/v1/chat/completions", body);
        if budget {
            req.headers_mut()
                .insert("x-tiergate-deadline-ms", "1000".parse().unwrap());
        }
        let app = r.app.clone();
        async move {
            let (_, h, _) = call(&app, req).await;
            let get = |k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
            (get("x-tiergate-backend"), get("x-tiergate-session"))
        }
    };
    assert_eq!(send(by_user.clone(), true).await, (s("fast"), s("new")));
    assert_eq!(send(by_user, false).await, (s("fast"), s("kept")));
}

/// Turn-level routing on a steered route: a turn that continues an agent loop — a chat `tool` message, a
/// Responses `function_call_output`, a Messages user turn of `tool_result` blocks — keeps its pinned stage
/// although Tier-0 would now steer it elsewhere; the next genuine user turn follows Tier-0. A side call to
/// another model under the same session id has a pin of its own and moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_loop_keeps_its_stage_in_every_dialect_and_side_calls_move_nothing() {
    // Its model "renders tools": the loop's tool messages are the point.
    let entry = |name: &str| entry(name, "engine = \"stub\"\nworkers = 1\ntools = true");
    let steered = |c: &mut Config| {
        c.llm = vec![entry("small"), entry("big")];
        for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
            r.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Name("big".into()),
            ]);
            r.aliases = vec!["haiku".into()];
            r.steer =
                Some(toml::from_str("theta = 1.0\n[by_label]\ncard_lost = \"small\"").unwrap());
        }
    };
    let r = all_live(rig(1, steered));
    // The route's θ, live: at 1 every label is sure (card_lost → small), at 0 none is (→ big).
    let set_theta = |theta: f64| {
        let req = admin_req(
            "PATCH",
            "/admin/routing?route=generate",
            Some(json!({ "theta_base": theta })),
        );
        let admin = r.admin.clone();
        async move { call(&admin, req).await }
    };
    let turn = |uri: &'static str, session: &str, body: Value| {
        let mut req = post(uri, body);
        let h = req.headers_mut();
        h.insert("x-session-id", session.parse().unwrap());
        h.insert("anthropic-version", "2023-06-01".parse().unwrap());
        let app = r.app.clone();
        async move {
            let (st, h, b) = call(&app, req).await;
            assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            let get = |k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
            (get("x-tiergate-stage"), get("x-tiergate-session"))
        }
    };
    let s = |v: &str| Some(v.to_string());
    let user = |text: &str| json!({"role": "user", "content": text});
    let chat_start = json!({"model": "generate", "messages": [user("card lost")]});
    let chat_loop = json!({"model": "generate", "messages": [user("card lost"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found it"}]});
    let chat_next = json!({"model": "generate", "messages": [user("card lost"),
        {"role": "assistant", "content": "done"}, user("card lost again")]});
    let resp_start = json!({"model": "generate", "input": "card lost"});
    let resp_loop = json!({"model": "generate", "input": [
        {"type": "message", "role": "user", "content": "card lost"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found it"}]});
    let msg_start = json!({"model": "generate", "max_tokens": 8, "messages": [user("card lost")]});
    let msg_loop = json!({"model": "generate", "max_tokens": 8, "messages": [user("card lost"),
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "found it"}]}]});
    for (uri, start, in_loop) in [
        ("/v1/chat/completions", &chat_start, &chat_loop),
        ("/v1/responses", &resp_start, &resp_loop),
        ("/v1/messages", &msg_start, &msg_loop),
    ] {
        let session = format!("loop-{uri}");
        set_theta(1.0).await;
        assert_eq!(
            turn(uri, &session, start.clone()).await,
            (s("small"), s("new")),
            "{uri}"
        );
        // Tier-0 would now send the same question to the big stage (nothing is sure at θ = 0) …
        set_theta(0.0).await;
        // … but the loop's turns stay where the loop began.
        for _ in 0..2 {
            assert_eq!(
                turn(uri, &session, in_loop.clone()).await,
                (s("small"), s("kept")),
                "{uri}"
            );
        }
    }
    // A genuine user turn follows Tier-0 (up, here).
    assert_eq!(
        turn(
            "/v1/chat/completions",
            "loop-/v1/chat/completions",
            chat_next
        )
        .await,
        (s("big"), s("up"))
    );
    // A side call to another model (an alias of the same route) under the same session id: a pin of its own
    // (new, on the small stage Tier-0 sends it to at θ = 1) …
    set_theta(1.0).await;
    let side = json!({"model": "haiku", "messages": [user("card lost")]});
    let main = "loop-/v1/chat/completions";
    assert_eq!(
        turn("/v1/chat/completions", main, side).await,
        (s("small"), s("new"))
    );
    // … and the main conversation's loop still runs where its pin is: the big stage.
    let main_loop = json!({"model": "generate", "messages": [user("card lost"),
        {"role": "assistant", "content": "done"}, user("card lost again"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function",
         "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "found it"}]});
    assert_eq!(
        turn("/v1/chat/completions", main, main_loop).await,
        (s("big"), s("kept"))
    );
    // The decision record says what the turn did to its pin.
    let mut req = post(
        "/v1/chat/completions",
        json!({"model": "generate", "messages": [user("card lost")]}),
    );
    req.headers_mut()
        .insert("x-session-id", "recorded".parse().unwrap());
    let (_, _, b) = call(&r.app, req).await;
    let id = serde_json::from_slice::<Value>(&b).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let store = r.engine.ledger().unwrap().store();
    let t = Instant::now();
    let rec = loop {
        let now = tiergate_engine::evidence::ledger::now_ms();
        if let Some(rec) = store.decision(&id, now).unwrap() {
            break rec;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no record of {id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(rec.session.as_deref(), Some("new"));
    // And the console's list of decisions, newest first.
    assert_eq!(r.engine.console()["decisions"][0]["session"], "new");
}

/// Placement that spreads: on a stage that prefers latency, 100 new sessions (one turn each) on two backends —
/// one with a slower prior — split by the sessions each already holds and its measured speed: a's share near
/// b's mean time ÷ the sum of both (the split at which the sessions held cost each the same), about evenly
/// when their speeds are equal; requests without a session still go to the fastest prediction (every one of
/// them, here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_spread_by_the_sessions_each_backend_holds_and_its_speed() {
    let entry = |name: &str, prior: u64, delay: u64| {
        entry(
            name,
            &format!(
                "engine = \"stub\"\nworkers = 1\ngenerate_prior_ms = {prior}\n\
                 extra_args = [\"--stub-delay-ms\", \"{delay}\"]"
            ),
        )
    };
    // (sessions on a, a's mean, b's mean) over 100 one-turn requests.
    let split = |delays: (u64, u64), sessions: bool| async move {
        let r = all_live(rig(
            1,
            with_stage(
                vec![entry("a", 100, delays.0), entry("b", 2000, delays.1)],
                "any = [\"a\", \"b\"]\nprefer = \"latency\"",
                |r| r == "generate",
            ),
        ));
        let (mut on_a, mut ms) = (0, [Vec::new(), Vec::new()]);
        for i in 0..100 {
            let mut req = post("/v1/chat/completions", chat("generate", "hello"));
            if sessions {
                let id = format!("s-{i}");
                req.headers_mut()
                    .insert("x-session-id", id.parse().unwrap());
            }
            let t = Instant::now();
            let (s, h, b) = call(&r.app, req).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            let a = h["x-tiergate-backend"] == "a";
            on_a += usize::from(a);
            ms[usize::from(!a)].push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
        (on_a, mean(&ms[0]), mean(&ms[1]))
    };
    let (equal, ..) = split((20, 20), true).await;
    let (faster, ma, mb) = split((10, 160), true).await;
    let (plain, ..) = split((20, 20), false).await;
    let expected = 100.0 * mb / (ma + mb);
    eprintln!(
        "new sessions on a: {equal}/100 (equal speeds); {faster}/100 with a at {ma:.0} ms and b at {mb:.0} ms \
         (expected {expected:.0}); without sessions {plain}/100"
    );
    assert!(
        (35..=65).contains(&equal),
        "equal speeds: {equal} of 100 new sessions on a"
    );
    assert!(
        (faster as f64 - expected).abs() <= 15.0,
        "a faster: {faster} of 100 on a, {expected:.0} expected from the measured means"
    );
    assert!(faster > equal, "the faster backend takes more");
    assert!(
        plain >= 95,
        "without sessions the fastest prediction takes them: {plain} on a"
    );
}

/// A key several conversations share (here one `prompt_cache_key` for two conversations) is pinned like any
/// other while its backend is calm, and yields under load: the next turn goes where the stage would send it,
/// and the pin follows. A conversation is told apart by its first user message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_on_a_shared_key_yields_under_load() {
    let entry = |name: &str| {
        entry(
            name,
            "engine = \"stub\"\nworkers = 1\nmax_concurrent = 1\ngenerate_prior_ms = 300\n\
             extra_args = [\"--stub-delay-ms\", \"300\"]",
        )
    };
    let r = all_live(rig(
        1,
        with_stage(
            vec![entry("a"), entry("b")],
            "any = [\"a\", \"b\"]\nprefer = \"latency\"",
            |r| r == "generate",
        ),
    ));
    let turn = |first: &str, key: Option<&str>| {
        let mut body =
            json!({"model": "generate", "messages": [{"role": "user", "content": first}]});
        if let Some(k) = key {
            body["prompt_cache_key"] = json!(k);
        }
        let app = r.app.clone();
        async move {
            let (s, h, b) = call(&app, post("/v1/chat/completions", body)).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            let get = |k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
            (get("x-tiergate-backend"), get("x-tiergate-session"))
        }
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(turn("x", Some("team")).await, (s("a"), s("new")));
    // Another conversation under the same key, a calm: the pin holds (and the key is now known as shared).
    assert_eq!(turn("y", Some("team")).await, (s("a"), s("kept")));
    // a gets busy with a request of no session (the stage's fastest prediction: a, listed first at a tie).
    let busy = tokio::spawn(turn("z", None));
    let t = Instant::now();
    while r.engine.console()["backends"][0]["running"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(5), "a never got busy");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The shared key's next turn yields: b, and the pin follows.
    assert_eq!(turn("y", Some("team")).await, (s("b"), s("switched")));
    assert_eq!(busy.await.unwrap().0, s("a"));
    // Each backend's measured per-token times are in the console: the stub sleeps 150 ms before each of its
    // two tokens, so one token after the first takes about that.
    let backends = r.engine.console()["backends"].clone();
    for b in backends.as_array().unwrap() {
        let decode = b["decode_ms_per_token"].as_f64().unwrap();
        assert!((100.0..600.0).contains(&decode), "{b}");
        assert!(b["prefill_ms_per_token"].as_f64().unwrap() > 0.0, "{b}");
    }
}

/// A priced switch (`sessions.switch = "priced"`, the default) on a steered route over a fast `small` stage
/// (stub, 30 ms a generation) and a slow `big` one (600 ms), once each backend's figures are measured: a
/// session on `big` whose next turn Tier-0 steers to `small` moves when its conversation is short (reading it
/// again on `small` costs little against the saving) and stays when it is long (16 KB: reading it again costs
/// more than the saving over the horizon); a move up goes within the session's switch budget, and a request
/// that lowers the budget to 0 % stays. The price is in `x-tiergate-switch` and the console's decisions; a bad
/// budget header is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_stages_is_priced_against_reading_the_conversation_again() {
    let entry = |name: &str, delay: u64| {
        entry(
            name,
            &format!(
                "engine = \"stub\"\nworkers = 1\nextra_args = [\"--stub-delay-ms\", \"{delay}\"]"
            ),
        )
    };
    let r = all_live(rig(1, |c: &mut Config| {
        c.llm = vec![entry("small", 30), entry("big", 600)];
        for r in c.routes.iter_mut().filter(|r| r.name == "generate") {
            r.stages = Some(vec![
                StageConfig::Name("small".into()),
                StageConfig::Name("big".into()),
            ]);
            r.steer =
                Some(toml::from_str("theta = 1.0\n[by_label]\ncard_lost = \"small\"").unwrap());
        }
    }));
    let header =
        |h: &axum::http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    // A turn: `history` earlier (user, assistant) pairs, then `text`.
    let turn =
        |session: Option<&str>, history: &[(String, String)], text: &str, pct: Option<&str>| {
            let mut messages: Vec<Value> = Vec::new();
            for (u, a) in history {
                messages.push(json!({"role": "user", "content": u}));
                messages.push(json!({"role": "assistant", "content": a}));
            }
            messages.push(json!({"role": "user", "content": text}));
            let mut req = post(
                "/v1/chat/completions",
                json!({"model": "generate", "messages": messages, "max_tokens": 8}),
            );
            for (k, v) in [
                ("x-session-id", session),
                ("x-tiergate-max-switch-spend-pct", pct),
            ] {
                if let Some(v) = v {
                    req.headers_mut().insert(k, v.parse().unwrap());
                }
            }
            let app = r.app.clone();
            async move {
                let (st, h, b) = call(&app, req).await;
                assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
                (
                    header(&h, "x-tiergate-stage").unwrap(),
                    header(&h, "x-tiergate-session"),
                    header(&h, "x-tiergate-switch"),
                )
            }
        };
    // Each backend's figures, measured on turns without a session.
    for _ in 0..3 {
        assert_eq!(turn(None, &[], "card lost", None).await.0, "small");
        assert_eq!(turn(None, &[], "pay bill", None).await.0, "big");
    }
    let backends = r.engine.console()["backends"].clone();
    for b in backends.as_array().unwrap() {
        assert!(b["decode_ms_per_token"].as_f64().unwrap() > 0.0, "{b}");
        assert!(b["completion_tokens"].as_f64().unwrap() > 0.0, "{b}");
    }
    let s = |v: &str| Some(v.to_string());
    let said = |h: Option<String>, what: &str| {
        let h = h.expect("x-tiergate-switch");
        assert!(h.starts_with(what), "{h}");
        h
    };
    // Short: on big, then steered to small — it moves, for its saving.
    let short = vec![("pay bill".to_string(), "stub: pay bill".to_string())];
    assert_eq!(
        turn(s("p").as_deref(), &[], "pay bill", None).await.1,
        s("new")
    );
    let (stage, pin, sw) = turn(Some("p"), &short, "card lost", None).await;
    assert_eq!((stage.as_str(), pin), ("small", s("down")));
    said(sw, "moved; why=saving");
    // Long: 16 KB before this turn — reading it again on small costs more than the saving: it stays on big.
    let long = vec![("pay bill ".repeat(800), "stub: pay bill".repeat(100))];
    assert_eq!(turn(Some("q"), &[], "pay bill", None).await.1, s("new"));
    let (stage, pin, sw) = turn(Some("q"), &long, "card lost", None).await;
    assert_eq!((stage.as_str(), pin), ("big", s("kept")));
    said(sw, "stayed; why=dear");
    // Up, from small to big: within the budget it moves; with the request's budget at 0 % it stays.
    assert_eq!(turn(Some("u"), &[], "card lost", None).await.1, s("new"));
    let back = vec![("card lost".to_string(), "stub: card lost".to_string())];
    let (stage, _, sw) = turn(Some("u"), &back, "pay bill", Some("0")).await;
    assert_eq!(stage, "small");
    said(sw, "stayed; why=budget");
    let (stage, pin, sw) = turn(Some("u"), &back, "pay bill", None).await;
    assert_eq!((stage.as_str(), pin), ("big", s("up")));
    said(sw, "moved; why=quality");
    // A turn with no move to weigh carries no price.
    assert_eq!(turn(Some("u"), &back, "pay bill", None).await.2, None);
    // The console's decisions carry the price.
    let decisions = r.engine.console()["decisions"].clone();
    let priced: Vec<&Value> = decisions
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d.get("switch").is_some())
        .collect();
    assert_eq!(priced.len(), 4, "{decisions}");
    assert!(priced
        .iter()
        .any(|d| d["switch"]["why"] == "dear" && d["switch"]["cost_ms"].as_f64().unwrap() > 0.0));
    // A bad budget is a 400 naming the header.
    let mut bad = post("/v1/chat/completions", chat("generate", "hello"));
    bad.headers_mut()
        .insert("x-tiergate-max-switch-spend-pct", "-3".parse().unwrap());
    let (st, _, b) = call(&r.app, bad).await;
    let v = assert_openai_error(st, &b, 400);
    assert_eq!(v["error"]["param"], "x-tiergate-max-switch-spend-pct");
}
