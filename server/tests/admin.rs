//! The admin API on the in-process rig: the routing policy validated, versioned and guarded, concurrent
//! changes losing no update, health, readiness and `/info` with its secrets redacted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tiergate_config::RoutingConfig;

mod common;
use common::rig::*;

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
    assert_eq!(r.engine.policy(&Default::default()).unwrap().1, 2);
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
    let (p, version) = r.engine.policy(&Default::default()).unwrap();
    assert_eq!(p["theta_base"], 0.7 + 149.0 / 1000.0);
    assert_eq!(version, 1 + 450, "every PATCH made exactly one version");
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
