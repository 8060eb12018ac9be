//! The in-process rig the server's HTTP tests share: the real router and state over a tiny few-shot
//! classifier (no download) and stub reranker worker processes behind the real shared-memory queue, with
//! request helpers.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tiergate_config::Config;
use tiergate_prefilter::testing::TinyModel;
use tiergate_server::routes::{admin_router, router};
use tower::ServiceExt;

pub struct Rig {
    pub app: axum::Router,
    pub admin: axum::Router,
    pub engine: tiergate_engine::Engine,
    pub tiny: TinyModel,
}

pub fn rig(workers: usize, tweak: impl FnOnce(&mut Config)) -> Rig {
    let tiny = TinyModel::create(2).unwrap();
    let mut cfg = super::config(&tiny);
    cfg.reranker.workers = workers;
    cfg.reranker.engine = tiergate_config::EngineKind::Stub;
    cfg.reranker.heartbeat_timeout_ms = 1000;
    cfg.server.admin_token = Some(TOKEN.into());
    cfg.routing.allow_header_override = true;
    cfg.server.max_body_bytes = 16 * 1024;
    tweak(&mut cfg);
    let engine =
        tiergate_engine::Engine::build(cfg, None, Some(super::worker_program()), None).unwrap();
    let t = Instant::now();
    while engine.readiness().1["live_workers"].as_u64().unwrap() < workers as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "stub worker did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Rig {
        app: router(engine.clone()),
        admin: admin_router(engine.clone()),
        engine,
        tiny,
    }
}

pub const TOKEN: &str = "secret-token";

/// An admin-listener request with the admin token, and a JSON body when given.
pub fn admin_req(method: &str, uri: &str, body: Option<Value>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |v| Body::from(v.to_string())))
        .unwrap()
}

/// Forces θ on a chat request the way an operator may: the override header plus the admin token.
pub fn force(req: &mut Request<Body>, theta: &str) {
    req.headers_mut()
        .insert("x-tiergate-threshold", theta.parse().unwrap());
    req.headers_mut()
        .insert("x-tiergate-admin-token", TOKEN.parse().unwrap());
}

pub async fn call(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, body)
}

pub fn post(uri: &str, body: Value) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

pub fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

pub fn assert_openai_error(status: StatusCode, body: &[u8], want: u16) -> Value {
    assert_eq!(status.as_u16(), want, "{}", String::from_utf8_lossy(body));
    let v: Value = serde_json::from_slice(body).unwrap();
    let e = &v["error"];
    assert!(
        e["message"].is_string()
            && e["type"].is_string()
            && e.get("param").is_some()
            && e.get("code").is_some(),
        "{v}"
    );
    v
}

pub fn admin(
    method: &str,
    body: Option<Value>,
    token: bool,
    if_match: Option<&str>,
) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri("/admin/routing")
        .header("content-type", "application/json");
    if token {
        b = b.header("authorization", format!("Bearer {TOKEN}"));
    }
    if let Some(v) = if_match {
        b = b.header("if-match", v);
    }
    b.body(body.map_or_else(Body::empty, |v| Body::from(v.to_string())))
        .unwrap()
}

// Helpers several test files share.

pub async fn patch_routing(r: &Rig, body: Value) {
    let (s, _, b) = call(&r.admin, admin("PATCH", Some(body), true, None)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
}

pub async fn json_answer(r: &Rig, model: &str, text: &str) -> (axum::http::HeaderMap, Value) {
    let mut body = chat(model, text);
    body["response_format"] = json!({"type": "json_object"});
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    (h, serde_json::from_str(content).unwrap())
}

pub fn digest(key: &str) -> String {
    use std::fmt::Write;
    // The test computes the SHA-256 the operator would (`printf %s "$KEY" | sha256sum`) with the server's own
    // crate, then checks the server finds the tenant by it.
    let d = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes());
    d.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub fn tenants(c: &mut Config) {
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

pub fn with_key(mut req: Request<Body>, auth: Option<&str>) -> Request<Body> {
    if let Some(a) = auth {
        req.headers_mut()
            .insert("authorization", a.parse().unwrap());
    }
    req
}

pub fn tenant_chat(key: &str, text: &str) -> Request<Body> {
    with_key(
        post("/v1/chat/completions", chat("classify", text)),
        Some(&format!("Bearer {key}")),
    )
}

pub async fn give_feedback(r: &Rig, key: &str, body: Value) -> (StatusCode, Value) {
    let req = with_key(post("/v1/feedback", body), Some(&format!("Bearer {key}")));
    let (s, _, b) = call(&r.app, req).await;
    (s, serde_json::from_slice(&b).unwrap())
}

/// Classify and answer routes with an out-of-scope outcome, on the few-shot head (no `oos.json`: scored by
/// 1 − max p, threshold configured). The threshold moves live through `/admin/routing`, so the test pins each
/// outcome without depending on the tiny model's scores.
pub fn guarded(c: &mut Config) {
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
            cache_generations: false,
            steer: None,
            context_turns: 0,
            context_chars: 400,
            aliases: Vec::new(),
            default: false,
            max_tokens: None,
            max_text_chars: None,
        });
    }
}

/// Writes a trained head over the rig's tiny encoder: for each label of `labels`, the row of label `rows[i]`
/// is that label's prototype (its examples' mean embedding, normalised) times `scale`; zero bias.
pub fn write_prototype_head(
    r: &Rig,
    out: &std::path::Path,
    labels: &[(&str, &[&str])],
    rows: &[usize],
    scale: f64,
    dev: tiergate_prefilter::heads::DevReport,
    split: Option<tiergate_prefilter::heads::TrainSplit>,
) {
    use candle_core::{DType, Tensor};
    let (tok, enc) = tiergate_prefilter::classifier::load_encoder(
        r.tiny.dir.path(),
        tiergate_config::PoolingConfig::Auto,
        16,
    )
    .unwrap();
    let protos: Vec<Tensor> = labels
        .iter()
        .map(|(_, texts)| {
            let e = tiergate_prefilter::classifier::embed_texts(&tok, &enc, texts, 8).unwrap();
            let m = e.mean(0).unwrap();
            let norm = m.sqr().unwrap().sum_all().unwrap().sqrt().unwrap();
            m.broadcast_div(&norm).unwrap()
        })
        .collect();
    let picked: Vec<Tensor> = rows.iter().map(|&i| protos[i].clone()).collect();
    let w = (Tensor::stack(&picked, 0).unwrap() * scale)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let b = Tensor::zeros(labels.len(), DType::F32, &candle_core::Device::Cpu).unwrap();
    let meta = tiergate_prefilter::heads::TrainedHeadMeta {
        format: tiergate_prefilter::heads::HEAD_FORMAT,
        labels: labels.iter().map(|(l, _)| l.to_string()).collect(),
        temperature: 1.0,
        encoder: r.tiny.dir.path().to_path_buf(),
        hidden_size: r.tiny.hidden,
        fine_tuned: false,
        dev,
        examples: Vec::new(),
        descriptions: Vec::new(),
        split,
    };
    tiergate_prefilter::heads::save_trained(out, &meta, &w, &b).unwrap();
}

/// A chat request to `route` validated as the chat door validates it, for the anonymous tenant, with a
/// `forced` θ.
pub fn valid(
    engine: &tiergate_engine::Engine,
    route: &str,
    text: &str,
    forced: Option<f64>,
) -> tiergate_server::validate::ValidChat {
    let body = json!({"model": route, "messages": [{"role": "user", "content": text}]});
    let headers = axum::http::HeaderMap::new();
    let caller = tiergate_server::validate::Caller {
        tenant: tiergate_engine::model::request::TenantId::anonymous(),
        batch: None,
        headers: &headers,
        started: Instant::now(),
        forced: Ok(forced.map(|t| (t, true))),
    };
    let req = serde_json::from_value(body).unwrap();
    tiergate_server::validate::validate(req, |n| engine.route_facts(n), caller).unwrap()
}

/// A request in flight: the engine's answer to a classify request, which holds its admission permit until
/// it is dropped.
pub async fn in_flight(r: &Rig) -> tiergate_engine::answer::Answer {
    let v = valid(&r.engine, "classify", "card lost", None);
    r.engine.answer(&v).await.ok().unwrap()
}
