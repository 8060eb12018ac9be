//! The checked live head swap on the in-process rig: trained heads written over the tiny BERT's own
//! embeddings (a right one, one with its labels permuted, one too flat to be sure of anything) go through
//! `POST /admin/heads/{route}`, shadow live requests and are refused or promoted by their checks; a promotion
//! under concurrent requests is atomic; a rollback restores the head it replaced; a head whose folder
//! vanishes keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tiergate_prefilter::heads::{DevReport, TrainSplit};

mod common;
use common::rig::*;

/// The rig's labels and their example texts (the few-shot head in force has the same).
const LABELS: [(&str, &[&str]); 3] = [
    ("card_lost", &["card lost", "card stolen"]),
    ("greeting", &["hello hi"]),
    ("pay_bill", &["pay bill"]),
];

/// Writes a trained head whose row for label i is `rows[i]`'s prototype (its examples' mean embedding,
/// normalised) times `scale`.
fn write_head(r: &Rig, out: &Path, rows: [usize; 3], scale: f64, dev_accuracy: f64) {
    let dev = DevReport {
        n: 4,
        accuracy: dev_accuracy,
        ece_uncalibrated: 0.0,
        ece: 0.0,
        temperature_rows: 0,
        calibration_flaw: None,
    };
    let split = Some(TrainSplit {
        dev_fraction: 0.25,
        seed: 1,
        per_label: None,
    });
    write_prototype_head(r, out, &LABELS, &rows, scale, dev, split);
}

fn holdout(dir: &Path) -> PathBuf {
    let p = dir.join("holdout.jsonl");
    let lines: Vec<String> = LABELS
        .iter()
        .flat_map(|(l, texts)| {
            texts
                .iter()
                .map(move |t| json!({"text": t, "label": l}).to_string())
        })
        .collect();
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

/// One classify request: (status, head version header, answered label).
async fn ask(app: &axum::Router, text: &str) -> (StatusCode, String, String) {
    let (s, h, b) = call(app, post("/v1/chat/completions", chat("classify", text))).await;
    let v: Value = serde_json::from_slice(&b).unwrap_or_default();
    let version = h
        .get("x-tiergate-head-version")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let label = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (s, version, label)
}

async fn heads(r: &Rig) -> Value {
    let (s, _, b) = call(&r.admin, admin_req("GET", "/admin/heads", None)).await;
    assert_eq!(s, StatusCode::OK);
    serde_json::from_slice(&b).unwrap()
}

/// Sends requests until the history has an event `action` for `version` (the shadow's verdict), and returns it.
async fn verdict(r: &Rig, version: &str) -> Value {
    let t = Instant::now();
    loop {
        for text in ["card lost", "pay bill", "hello hi"] {
            assert_eq!(ask(&r.app, text).await.0, StatusCode::OK);
        }
        let h = heads(r).await;
        let found = h["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["version"] == version && e["action"] != "shadow");
        if let Some(e) = found {
            return e.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no verdict: {h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn start(r: &Rig, dir: &Path, hold: Option<&Path>) -> (StatusCode, Value) {
    let mut body = json!({"dir": dir, "requests": 9});
    if let Some(h) = hold {
        body["holdout"] = json!(h);
    }
    let (s, _, b) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify", Some(body)),
    )
    .await;
    (s, serde_json::from_slice(&b).unwrap())
}

/// A head with its labels permuted is refused on accuracy, one too flat to be sure is refused on the share it
/// would escalate, and a right one is promoted: the responses then name it, `/admin/heads` and the history say
/// so, and a rollback puts the first head back. Bad requests are clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_refuses_a_worse_head_promotes_a_better_one_and_rollback_restores() {
    let r = rig(1, |c| {
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 0.5;
    });
    let work = tempfile::tempdir().unwrap();
    let hold = holdout(work.path());
    let (good, permuted, flat) = (
        work.path().join("good"),
        work.path().join("permuted"),
        work.path().join("flat"),
    );
    write_head(&r, &good, [0, 1, 2], 20.0, 1.0);
    write_head(&r, &permuted, [2, 0, 1], 20.0, 1.0);
    write_head(&r, &flat, [0, 1, 2], 0.01, 1.0);
    let (_, v0, label) = ask(&r.app, "card lost").await;
    assert_eq!(label, "card_lost");
    assert!(!v0.is_empty(), "every classified response names its head");

    let (s, v) = start(&r, &permuted, Some(&hold)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, busy) = start(&r, &good, Some(&hold)).await;
    assert_eq!(s, StatusCode::CONFLICT, "one shadow at a time: {busy}");
    let e = verdict(&r, v["version"].as_str().unwrap()).await;
    assert_eq!(e["action"], "refused", "{e}");
    let reason = e["reason"].as_str().unwrap();
    assert!(
        reason.contains("accuracy FAILED") && reason.contains("holdout"),
        "{reason}"
    );
    assert_eq!(
        ask(&r.app, "card lost").await.1,
        v0,
        "a refused head never answers"
    );

    let (s, v) = start(&r, &flat, Some(&hold)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let e = verdict(&r, v["version"].as_str().unwrap()).await;
    assert_eq!(e["action"], "refused", "{e}");
    let reason = e["reason"].as_str().unwrap();
    assert!(
        reason.contains("accuracy ok") && reason.contains("escalated_share FAILED"),
        "{reason}"
    );

    let (s, v) = start(&r, &good, Some(&hold)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let v1 = v["version"].as_str().unwrap().to_string();
    assert_eq!(v["in_force"], v0.as_str());
    let e = verdict(&r, &v1).await;
    assert_eq!(e["action"], "promoted", "{e}");
    assert_eq!(e["replaced"], v0.as_str());
    assert!(e["reason"].as_str().unwrap().contains("start anew"), "{e}");
    let (s, v, label) = ask(&r.app, "card lost").await;
    assert_eq!(
        (s, v.as_str(), label.as_str()),
        (StatusCode::OK, v1.as_str(), "card_lost")
    );
    let h = heads(&r).await;
    let classify = h["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["route"] == "classify")
        .unwrap()
        .clone();
    assert_eq!(classify["version"], v1.as_str(), "{h}");
    assert_eq!(classify["can_roll_back"], true);
    assert_eq!(classify["dir"], json!(good));
    let (_, _, b) = call(&r.admin, admin_req("GET", "/info", None)).await;
    let info: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        info["heads"]["classify"]["version"],
        v1.as_str(),
        "{}",
        info["heads"]
    );
    let (s, _, b) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify", Some(json!({"dir": good}))),
    )
    .await;
    assert_openai_error(s, &b, 409);

    let (s, _, b) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify/rollback", None),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let back: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (back["version"].as_str(), back["replaced"].as_str()),
        (Some(v0.as_str()), Some(v1.as_str()))
    );
    assert_eq!(ask(&r.app, "card lost").await.1, v0);
    let history = heads(&r).await;
    let actions: Vec<&str> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "shadow",
            "refused",
            "shadow",
            "refused",
            "shadow",
            "promoted",
            "rolled_back"
        ]
    );

    // Bad requests.
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            "/admin/heads/classify",
            Some(json!({"dir": work.path().join("none")})),
        ),
    )
    .await;
    let e = assert_openai_error(s, &b, 400);
    assert_eq!(e["error"]["param"], "dir", "{e}");
    let (s, _, b) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/nope", Some(json!({"dir": good}))),
    )
    .await;
    assert_openai_error(s, &b, 404);
    let (s, _, b) = call(
        &r.admin,
        admin_req(
            "POST",
            "/admin/heads/classify",
            Some(json!({"dir": good, "oops": 1})),
        ),
    )
    .await;
    assert_openai_error(s, &b, 400);
    let (s, _, b) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/answer/rollback", None),
    )
    .await;
    assert_openai_error(s, &b, 409);
    let (s, _, b) = call(
        &r.admin,
        Request::post("/admin/heads/classify/rollback")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_openai_error(s, &b, 401);
}

/// 16 clients ask while a head whose answers differ (its labels permuted; the accuracy margin opened so it
/// passes) is promoted and rolled back: every response is a 200 whose answer is the one the head it names
/// gives — never one head's version with the other's answer. The promoted head's folder then vanishes: it
/// keeps serving from memory, and the folder can no longer be put in shadow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_promotion_under_concurrent_requests_is_atomic_and_survives_its_files() {
    let r = Arc::new(rig(0, |c| {
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 1.0;
        c.heads.max_accuracy_drop = 1.0;
    }));
    let work = tempfile::tempdir().unwrap();
    let hold = holdout(work.path());
    let other = work.path().join("permuted");
    write_head(&r, &other, [2, 0, 1], 20.0, 0.5);
    let (_, v0, a0) = ask(&r.app, "card lost").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (r, stop) = (r.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (s, v, label) = ask(&r.app, "card lost").await;
                    assert_eq!(s, StatusCode::OK);
                    seen.push((v, label));
                }
                seen
            })
        })
        .collect();
    let (s, v) = start(&r, &other, Some(&hold)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let v1 = v["version"].as_str().unwrap().to_string();
    let e = verdict(&r, &v1).await;
    assert_eq!(e["action"], "promoted", "{e}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _, _) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify/rollback", None),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _, _) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify/rollback", None),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a rollback of the rollback puts the promoted head back"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut pairs = std::collections::BTreeMap::new();
    for c in clients {
        for (v, label) in c.await.unwrap() {
            pairs
                .entry(v)
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(label);
        }
    }
    assert_eq!(pairs.len(), 2, "both heads answered: {pairs:?}");
    assert_eq!(pairs[&v0].iter().collect::<Vec<_>>(), [&a0], "{pairs:?}");
    let a1: Vec<&String> = pairs[&v1].iter().collect();
    assert_eq!(a1.len(), 1, "one answer per head: {pairs:?}");
    assert_ne!(a1[0], &a0, "the permuted head answers otherwise: {pairs:?}");

    // The promoted head's folder vanishes: its weights are in memory, it keeps answering.
    std::fs::remove_dir_all(&other).unwrap();
    let (s, v, label) = ask(&r.app, "card lost").await;
    assert_eq!(
        (s, v.as_str(), &label),
        (StatusCode::OK, v1.as_str(), a1[0])
    );
    let (s, v) = start(&r, &other, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

/// `POST /admin/heads/{route}` under bad input, races and idleness: `requests` outside 1–100,000 and a holdout
/// over its bytes or rows are 400 before anything is loaded or classified; of two starts at once one is
/// refused (409) before it loads its head; a shadow on a route with no traffic is abandoned by its timer; a
/// candidate judged against a head that a rollback has since replaced is refused; an accuracy no server
/// measured (each head's recorded dev accuracy) is called the heads' own claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_swap_refuses_bad_input_races_and_stale_verdicts() {
    let r = rig(1, |c| {
        c.routing.mode = tiergate_config::RoutingMode::Static;
        c.routing.theta_base = 0.5;
        c.heads.shadow_timeout_s = 1;
        c.heads.max_accuracy_drop = 1.0;
        c.heads.max_escalated_increase = 1.0;
        c.heads.max_p50_ratio = 100.0;
    });
    let work = tempfile::tempdir().unwrap();
    let hold = holdout(work.path());
    let (good, other) = (work.path().join("good"), work.path().join("other"));
    write_head(&r, &good, [0, 1, 2], 20.0, 1.0);
    write_head(&r, &other, [0, 1, 2], 10.0, 1.0);
    // The race's two heads, apart from the later ones (a version's first verdict is the one looked for).
    let (racer1, racer2) = (work.path().join("racer1"), work.path().join("racer2"));
    write_head(&r, &racer1, [0, 1, 2], 12.0, 1.0);
    write_head(&r, &racer2, [0, 1, 2], 14.0, 1.0);
    let post_start = |body: Value| {
        let admin = r.admin.clone();
        async move {
            let (s, _, b) = call(
                &admin,
                admin_req("POST", "/admin/heads/classify", Some(body)),
            )
            .await;
            (s, b)
        }
    };
    for n in [0, 100_001] {
        let (s, b) = post_start(json!({"dir": good, "requests": n})).await;
        let e = assert_openai_error(s, &b, 400);
        assert_eq!(e["error"]["param"], "requests", "{e}");
    }
    let big = work.path().join("big.jsonl");
    let row = json!({"text": "card lost", "label": "card_lost"}).to_string();
    std::fs::write(&big, vec![row.as_str(); (9 << 20) / row.len()].join("\n")).unwrap();
    let many = work.path().join("many.jsonl");
    std::fs::write(&many, vec![row.as_str(); 20_001].join("\n")).unwrap();
    for (file, says) in [(&big, "bytes"), (&many, "rows")] {
        let (s, b) = post_start(json!({"dir": good, "holdout": file})).await;
        let e = assert_openai_error(s, &b, 400);
        assert_eq!(e["error"]["param"], "holdout", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{e}"
        );
    }
    assert!(heads(&r).await["history"].as_array().unwrap().is_empty());

    // Two starts at once: one shadow, one 409 (the second never loads its head).
    let (a, b) = tokio::join!(
        post_start(json!({"dir": racer1, "requests": 9, "holdout": hold})),
        post_start(json!({"dir": racer2, "requests": 9, "holdout": hold}))
    );
    let mut codes = [a.0.as_u16(), b.0.as_u16()];
    codes.sort_unstable();
    assert_eq!(codes, [202, 409], "{a:?} {b:?}");
    let shadowing: Value = serde_json::from_slice(if a.0 == StatusCode::ACCEPTED {
        &a.1
    } else {
        &b.1
    })
    .unwrap();
    let idle = shadowing["version"].as_str().unwrap().to_string();
    // No traffic at all: the timer abandons it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let h = heads(&r).await;
    let ended = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["version"] == idle.as_str() && e["action"] == "abandoned")
        .unwrap_or_else(|| panic!("not abandoned on an idle route: {h}"))
        .clone();
    assert_eq!(ended["reason"], "saw 0 of 9 requests in 1 s", "{ended}");

    // Promote `good`, then shadow `other` against it and roll back under it: judged against a head no longer
    // in force, it is refused.
    let (s, v) = start(&r, &good, Some(&hold)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let v1 = v["version"].as_str().unwrap().to_string();
    assert_eq!(verdict(&r, &v1).await["action"], "promoted");
    // No request reaches it before the rollback: the verdict comes only once `verdict` sends traffic.
    let (s, v) = post_start(json!({"dir": other, "requests": 9})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&v));
    let v2 = serde_json::from_slice::<Value>(&v).unwrap()["version"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, _, _) = call(
        &r.admin,
        admin_req("POST", "/admin/heads/classify/rollback", None),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let e = verdict(&r, &v2).await;
    assert_eq!(e["action"], "refused", "{e}");
    let reason = e["reason"].as_str().unwrap();
    assert!(reason.contains("no longer in force"), "{reason}");
    // Judged without a holdout, on what each head's training recorded: the heads' own claim.
    assert!(reason.contains("own claim"), "{reason}");
}
