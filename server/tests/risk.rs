//! The error bound, feedback and audits on the in-process rig: what the bound escalates and what a breach
//! does, feedback joined to its answer once for its own tenant, audits estimating Tier-0's silent error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tiergate_config::Config;

mod common;
use common::rig::*;

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

/// Writes a trained head over the rig's tiny encoder: label i's row is the normalised mean embedding of its
/// examples, times `scale` (the few-shot head's labels).
fn write_head(r: &Rig, out: &std::path::Path, scale: f64) {
    let labels: [(&str, &[&str]); 3] = [
        ("card_lost", &["card lost", "card stolen"]),
        ("pay_bill", &["pay bill"]),
        ("greeting", &["hello hi"]),
    ];
    let dev = tiergate_prefilter::heads::DevReport {
        n: 1000,
        accuracy: 0.9,
        ece_uncalibrated: 0.0,
        ece: 0.0,
        temperature_rows: 1000,
        calibration_flaw: None,
    };
    write_prototype_head(r, out, &labels, &[0, 1, 2], scale, dev, None);
}

/// Texts of the tiny vocabulary, from clear to mixed.
const TEXTS: [&str; 24] = [
    "card lost",
    "card stolen",
    "pay bill",
    "hello hi",
    "my card is lost",
    "i want to pay the bill",
    "hello",
    "bye",
    "card bill",
    "lost money",
    "send money",
    "transfer money",
    "account balance",
    "what is my balance",
    "how to pay",
    "please help",
    "hi card",
    "pay my card",
    "stolen account",
    "hello pay",
    "i lost the bill",
    "help my account",
    "what was sent",
    "the card was stolen",
];

async fn tier_and_ambiguity(r: &Rig, text: &str, forced: Option<&str>) -> (String, f64, String) {
    let mut req = post("/v1/chat/completions", chat("classify", text));
    if let Some(t) = forced {
        force(&mut req, t);
    }
    let (s, h, b) = call(&r.app, req).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let get = |k: &str| h[k].to_str().unwrap().to_string();
    let c: f64 = get("x-tiergate-confidence").parse().unwrap();
    (get("x-tiergate-tier"), 1.0 - c, get("x-tiergate-threshold"))
}

/// The bound at a θ inside the traffic's ambiguities: a trained head whose `calibration.json` is wrong only
/// above a known ambiguity. The server's θ is the Learn-then-Test choice on exactly those rows (recomputed
/// here), it caps a static θ of 1, and each request escalates exactly when Tier-0's ambiguity is above it —
/// answers both ways, so a server that ignored the file (θ 1: nothing escalates; θ 0: everything does) fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_bound_follows_the_heads_calibration_rows() {
    use tiergate_core::risk::{choose, Row};
    let base = rig(0, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let head = dir.path().join("head");
    write_head(&base, &head, 8.0);
    let trained = |c: &mut Config| {
        c.prefilter.head =
            tiergate_config::HeadConfig::Trained(tiergate_config::TrainedHeadConfig {
                dir: head.clone(),
            });
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
    };
    // The head's ambiguity on each text, Tier-0 alone.
    let mut ambiguities = Vec::new();
    {
        let r = rig(0, trained);
        for t in TEXTS {
            let (tier, a, _) = tier_and_ambiguity(&r, t, None).await;
            assert_eq!(tier, "tier0");
            ambiguities.push(a);
        }
    }
    let mut sorted = ambiguities.clone();
    sorted.sort_by(f64::total_cmp);
    let (lo, hi) = (sorted[0], sorted[sorted.len() - 1]);
    assert!(
        hi - lo > 0.05,
        "the texts' ambiguities are spread: {sorted:?}"
    );
    // Calibration rows wrong only above the 40th percentile of those ambiguities.
    let edge = sorted[sorted.len() * 2 / 5];
    let rows: Vec<(f64, bool)> = (0..2000)
        .map(|i| {
            let a = f64::from(i) / 2000.0 * 0.7;
            (a, a > edge)
        })
        .collect();
    let as_rows: Vec<Row> = rows
        .iter()
        .map(|&(ambiguity, wrong)| Row { ambiguity, wrong })
        .collect();
    let want = choose(&as_rows, &as_rows, 0.05, 0.05);
    assert!(want.theta > 0.0 && want.reason.is_none(), "{want:?}");
    tiergate_prefilter::risk_rows::CalibrationRows {
        format: tiergate_prefilter::risk_rows::CALIBRATION_FORMAT,
        temperature: 1.0,
        ordering: rows.clone(),
        rows,
        in_sample: false,
        labels_left_out: 0,
    }
    .save(&head)
    .unwrap();

    let r = rig(1, |c| {
        trained(c);
        c.routing.max_error = Some(0.05);
        c.routing.confidence = 0.95;
        for route in c.routes.iter_mut().filter(|r| r.name == "classify") {
            route.context_turns = 1;
        }
    });
    let (_, _, b) = call(&r.admin, admin("GET", None, true, None)).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let risk = &v["risk"]["classify"];
    assert_eq!(risk["theta"].as_f64(), Some(want.theta), "{v}");
    assert_eq!(risk["n_calibration"], 2000);
    assert_eq!(risk["accepted"].as_u64(), Some(want.accepted));
    let (mut escalated, mut alone) = (0, 0);
    for (t, a) in TEXTS.iter().zip(&ambiguities) {
        let (tier, _, theta) = tier_and_ambiguity(&r, t, None).await;
        assert_eq!(theta, format!("{:.4}", want.theta));
        if (a - want.theta).abs() < 1e-4 {
            continue;
        }
        let expected = if *a > want.theta { "llm" } else { "tier0" };
        assert_eq!(tier, expected, "{t}: ambiguity {a:.4}, θ {:.4}", want.theta);
        match expected {
            "llm" => escalated += 1,
            _ => alone += 1,
        }
    }
    assert!(
        escalated > 0 && alone > 0,
        "θ {:.4} is inside the ambiguities {sorted:?}: escalated {escalated}, alone {alone}",
        want.theta
    );
    assert_eq!(risk["outside_proof"], false, "{risk}");
    // A policy θ below the grid's first θ is outside the proof: flagged, not capped (it escalates more).
    let start = risk["grid_start"].as_f64().unwrap();
    assert!(start > 0.0 && start <= want.theta, "{risk}");
    patch_routing(&r, json!({"theta_base": start / 2.0})).await;
    let (_, _, b) = call(&r.admin, admin("GET", None, true, None)).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    let risk = &v["risk"]["classify"];
    assert_eq!(risk["outside_proof"], true, "{risk}");
    assert_eq!(risk["theta_eff"].as_f64(), Some(start / 2.0), "not capped");
    // A follow-up is classified with its context (the route reads one earlier turn): outside the rows'
    // calibration (single utterances), so while the bound is set the LLM decides — even when Tier-0 is sure.
    let follow_ups = [
        ("card stolen", "card lost"),
        ("pay bill", "pay bill"),
        ("hello hi", "hello hi"),
        ("my card is lost", "card stolen"),
    ];
    for (first, then) in follow_ups {
        let (tier, _, turns) = follow_up(&r, first, then).await;
        assert_eq!(
            (tier.as_str(), turns.as_deref()),
            ("llm", Some("1")),
            "{first} / {then}"
        );
    }
    // Without the bound the same server answers every one of them alone.
    patch_routing(&r, json!({"max_error": null, "theta_base": 1.0})).await;
    for t in TEXTS {
        assert_eq!(tier_and_ambiguity(&r, t, None).await.0, "tier0");
    }
    // … the follow-ups too, flagged; and at least one was sure enough to stay with Tier-0 under the bound's
    // θ had it been a single utterance (so the escalations above were the context's doing).
    let mut sure = 0;
    for (first, then) in follow_ups {
        let (tier, a, turns) = follow_up(&r, first, then).await;
        assert_eq!((tier.as_str(), turns.as_deref()), ("tier0", Some("1")));
        sure += usize::from(a <= want.theta);
    }
    assert!(
        sure > 0,
        "no follow-up's ambiguity is under θ {:.4}",
        want.theta
    );
}

/// A two-turn conversation's tier, ambiguity and the context turns Tier-0 read.
async fn follow_up(r: &Rig, first: &str, then: &str) -> (String, f64, Option<String>) {
    let body = json!({"model": "classify", "messages": [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": then}]});
    let (s, h, b) = call(&r.app, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let get = |k: &str| h.get(k).map(|v| v.to_str().unwrap().to_string());
    let c: f64 = get("x-tiergate-confidence").unwrap().parse().unwrap();
    (
        get("x-tiergate-tier").unwrap(),
        1.0 - c,
        get("x-tiergate-context-turns"),
    )
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

/// What traffic teaches Tier-0 lands in the record file (`server.record_escalations`) with its provenance: an
/// escalation the LLM answered (`llm`, the fused distribution), an operator's audit label (`audit`, the text
/// and the probability it was drawn with; once, however often it is labelled), a trusted tenant's feedback
/// naming the true label (`feedback`), and with `server.record_tier0` each label Tier-0 answered alone
/// (`tier0`, a pseudo-label); an untrusted tenant's feedback and a bare right/wrong are not records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audits_and_trusted_feedback_are_harvested_with_their_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.jsonl");
    let path = file.clone();
    let r = rig(1, move |c| {
        tenants(c);
        for t in &mut c.tenants {
            (t.rate_per_s, t.burst) = (None, None);
        }
        c.tenants[1].feedback = tiergate_config::FeedbackTrust::Trusted;
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
        c.routing.audit_rate = 1.0;
        c.server.record_escalations = Some(path);
        c.server.record_text = true;
        c.server.record_tier0 = true;
    });
    let answer = |key: &'static str, text: &'static str, theta: Option<&'static str>| {
        let app = r.app.clone();
        async move {
            let mut req = tenant_chat(key, text);
            if let Some(t) = theta {
                force(&mut req, t);
            }
            let (s, h, b) = call(&app, req).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            let v: Value = serde_json::from_slice(&b).unwrap();
            (v["id"].as_str().unwrap().to_string(), h)
        }
    };
    let (_, h) = answer("key-b", "pay bill", Some("0")).await;
    assert_eq!(h["x-tiergate-tier"], "llm");
    let (_, h) = answer("key-b", "card lost", None).await;
    assert_eq!(h["x-tiergate-tier"], "tier0");
    let (trusted, _) = answer("key-b", "hello hi", None).await;
    let (untrusted, _) = answer("key-a", "lost my card", None).await;

    let t = Instant::now();
    let item = loop {
        let (_, _, b) = call(
            &r.admin,
            admin_req("GET", "/admin/audits?route=classify", None),
        )
        .await;
        let v: Value = serde_json::from_slice(&b).unwrap();
        let found = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["text"] == "card lost")
            .cloned();
        match found {
            Some(i) => break i,
            None if t.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            None => panic!("the answer to `card lost` was not queued for audit: {v}"),
        }
    };
    let id = item["id"].as_str().unwrap();
    for label in ["card_lost", "pay_bill"] {
        let (s, _, b) = call(
            &r.admin,
            admin_req(
                "POST",
                &format!("/admin/audits/{id}"),
                Some(json!({"label": label})),
            ),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    }
    let (s, v) = give_feedback(&r, "key-b", json!({"id": trusted, "label": "greeting"})).await;
    assert_eq!(
        (s, v["trusted"].as_bool()),
        (StatusCode::OK, Some(true)),
        "{v}"
    );
    let (s, v) = give_feedback(&r, "key-a", json!({"id": untrusted, "label": "card_lost"})).await;
    assert_eq!(
        (s, v["trusted"].as_bool()),
        (StatusCode::OK, Some(false)),
        "{v}"
    );

    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sources: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["source"].as_str().unwrap(), l["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sources,
        [
            ("llm", "pay bill"),
            ("tier0", "card lost"),
            ("tier0", "hello hi"),
            ("tier0", "lost my card"),
            ("audit", "card lost"),
            ("feedback", "hello hi")
        ],
        "{lines:?}"
    );
    let fused: f64 = lines[0]["fused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .sum();
    assert!((fused - 1.0).abs() < 1e-3, "{}", lines[0]);
    assert_eq!(
        lines[1]["label"], "card_lost",
        "Tier-0's own answer: {}",
        lines[1]
    );
    assert!(lines[1]["ambiguity"].as_f64().unwrap() < 1.0);
    let audit = &lines[4];
    assert_eq!(
        (
            audit["label"].as_str(),
            audit["answered"].as_str(),
            audit["probability"].as_f64()
        ),
        (Some("card_lost"), Some("card_lost"), Some(1.0)),
        "the first label, and the rate it was drawn at: {audit}"
    );
    assert_eq!(lines[5]["label"], "greeting");
    assert_eq!(lines[5]["route"], "classify");
}

/// A forced θ is not evidence: with every lone answer drawn for audit (`audit_rate = 1`), an answer under an
/// operator's forced θ of 1 (Tier-0 alone) is never drawn, and a trusted tenant's feedback on it is counted in
/// the `forced` channel, not the `tier0` one, and never joins the bound's evidence; the same request under the
/// policy's θ is drawn and its feedback is `tier0`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_theta_is_neither_audited_nor_evidence() {
    let r = rig(0, |c| {
        tenants(c);
        for t in &mut c.tenants {
            (t.rate_per_s, t.burst) = (None, None);
        }
        c.tenants[1].feedback = tiergate_config::FeedbackTrust::Trusted;
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
        c.routing.audit_rate = 1.0;
    });
    let ask = |forced: bool, text: &'static str| {
        let app = r.app.clone();
        async move {
            let mut req = tenant_chat("key-b", text);
            if forced {
                force(&mut req, "1");
            }
            let (s, h, b) = call(&app, req).await;
            assert_eq!(s, StatusCode::OK);
            assert_eq!(h["x-tiergate-tier"], "tier0");
            serde_json::from_slice::<Value>(&b).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let forced = ask(true, "card stolen").await;
    let plain = ask(false, "pay bill").await;
    let t = Instant::now();
    let texts = loop {
        let (_, _, b) = call(
            &r.admin,
            admin_req("GET", "/admin/audits?route=classify", None),
        )
        .await;
        let v: Value = serde_json::from_slice(&b).unwrap();
        let texts: Vec<String> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["text"].as_str().unwrap().to_string())
            .collect();
        if !texts.is_empty() || t.elapsed() > Duration::from_secs(5) {
            break texts;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(texts, ["pay bill"], "the forced answer is not drawn");
    for id in [&forced, &plain] {
        let (s, v) = give_feedback(&r, "key-b", json!({"id": id, "correct": false})).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let t = Instant::now();
    let fb = loop {
        let (_, _, b) = call(&r.admin, admin_req("GET", "/admin/feedback", None)).await;
        let v: Value = serde_json::from_slice(&b).unwrap();
        let fb = v["routes"]["classify"]["feedback"].clone();
        if fb.get("forced").is_some() || t.elapsed() > Duration::from_secs(5) {
            break fb;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(fb["forced"]["trusted_n"], 1, "{fb}");
    assert_eq!(fb["tier0"]["trusted_n"], 1, "{fb}");
    // Only the policy-θ answer is evidence for the bound.
    let head = r.engine.info()["heads"]["classify"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    let store = r.engine.ledger().unwrap().store();
    let evidence = store.trusted_feedback("classify", &head, 0).unwrap();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert!(evidence[0].row.wrong);
}
