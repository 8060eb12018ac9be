//! Tenants on the in-process rig: keys, routes and rates, the keys file reloaded under traffic, an LLM budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

mod common;
use common::rig::*;

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
