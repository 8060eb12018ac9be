//! Two real `tiergate serve` replicas sharing one policy through a real `redis-server` (Debian package,
//! started by the test on a free loopback port): a change through either replica reaches the other within
//! 2 s, versions stay monotonic, a stale `If-Match` is refused on either, the audit log is one list, and with
//! Redis killed both keep serving their last policy (and say so), refusing changes until it is back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{free_port, redis, start};

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn routing(admin: &str) -> Value {
    ureq::get(&format!("{admin}/admin/routing"))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

fn patch(admin: &str, body: Value, if_match: Option<u64>) -> Result<Value, u16> {
    let mut r = ureq::request("PATCH", &format!("{admin}/admin/routing"));
    if let Some(v) = if_match {
        r = r.set("if-match", &v.to_string());
    }
    match r.send_json(body) {
        Ok(resp) => Ok(resp.into_json().unwrap()),
        Err(ureq::Error::Status(code, _)) => Err(code),
        Err(e) => panic!("{e}"),
    }
}

/// Waits (≤ 2 s, the bound) until `admin` shows `version`; returns the view.
fn seen_within_2s(admin: &str, version: u64) -> Value {
    let t = Instant::now();
    loop {
        let v = routing(admin);
        if v["version"].as_u64() == Some(version) {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "version {version} not seen in 2 s: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One classify request to `base`: its status and its `header`.
fn chat_header(base: &str, header: &str) -> (u16, String) {
    let r = ureq::post(&format!("{base}/v1/chat/completions"))
        .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "my card was stolen"}]}))
        .unwrap();
    (r.status(), r.header(header).unwrap_or("").to_string())
}

fn chat_version(base: &str) -> (u16, String) {
    chat_header(base, "x-tiergate-policy-version")
}

#[test]
fn two_replicas_share_one_policy_through_a_real_redis() {
    let port = free_port();
    let redis_proc = redis(port);
    let store = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &format!("policy_store.url=\"redis://127.0.0.1:{port}\""),
        "--set",
        "reranker.workers=0",
    ];
    let a = start(&store);
    let b = start(&store);
    // Both converge on the one stored policy.
    let v0 = routing(&a.admin)["version"].as_u64().unwrap();
    seen_within_2s(&b.admin, v0);

    // A change through A reaches B (its admin view and its answers' version header).
    let va = patch(
        &a.admin,
        json!({"mode": "static", "theta_base": 0.42}),
        None,
    )
    .unwrap();
    let v1 = va["version"].as_u64().unwrap();
    assert_eq!(v1, v0 + 1);
    let vb = seen_within_2s(&b.admin, v1);
    assert_eq!(vb["theta_base"].as_f64(), Some(0.42));
    assert_eq!(chat_version(&b.base), (200, v1.to_string()));

    // A change through B reaches A; versions stay monotonic across replicas.
    let v2 = patch(&b.admin, json!({"k": 0.2}), Some(v1)).unwrap()["version"]
        .as_u64()
        .unwrap();
    assert_eq!(v2, v1 + 1);
    let va = seen_within_2s(&a.admin, v2);
    assert_eq!(
        (va["theta_base"].as_f64(), va["k"].as_f64()),
        (Some(0.42), Some(0.2)),
        "B's change merged onto A's"
    );

    // A stale If-Match is refused on either replica; nothing changes.
    assert_eq!(patch(&a.admin, json!({"k": 0.3}), Some(v1)), Err(412));
    assert_eq!(patch(&b.admin, json!({"k": 0.3}), Some(v1)), Err(412));
    assert_eq!(routing(&a.admin)["version"].as_u64(), Some(v2));

    // One audit log: the seeding and both changes, whichever replica took them.
    let audit: u64 = redis_cli(port, &["LLEN", "tiergate:policy:audit"])
        .parse()
        .unwrap();
    assert_eq!(audit, 3, "seeded + 2 changes");

    // Redis gone: both keep serving their last policy, say so, and refuse changes (503).
    drop(redis_proc);
    for s in [&a, &b] {
        let t = Instant::now();
        loop {
            let ready: Value = ureq::get(&format!("{}/ready", s.base))
                .call()
                .unwrap()
                .into_json()
                .unwrap();
            if ready["policy_store"]
                .as_str()
                .is_some_and(|p| p.starts_with("unreachable"))
            {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{ready}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(chat_version(&s.base), (200, v2.to_string()));
        assert_eq!(patch(&s.admin, json!({"k": 0.25}), None), Err(503));
    }
    let metrics = ureq::get(&format!("{}/metrics", a.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(metrics.contains("tiergate_policy_store_up 0"), "{metrics}");
}

/// Sends `per_s` classify requests a second for `secs` seconds to `base` as `key`; returns how many were
/// answered (200) and how many refused over the rate (429).
fn paced(base: String, key: &'static str, per_s: f64, secs: f64) -> (u32, u32) {
    let start = Instant::now();
    let (mut ok, mut limited) = (0, 0);
    let mut n = 0u32;
    while start.elapsed().as_secs_f64() < secs {
        let due = start + Duration::from_secs_f64(n as f64 / per_s);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        n += 1;
        let r = ureq::post(&format!("{base}/v1/chat/completions"))
            .set("authorization", &format!("Bearer {key}"))
            .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "card lost"}]}));
        match r {
            Ok(_) => ok += 1,
            Err(ureq::Error::Status(429, _)) => limited += 1,
            Err(e) => panic!("{e}"),
        }
    }
    (ok, limited)
}

/// A tenant's request rate holds across two replicas sharing a real Redis: each replica keeps its own bucket
/// and exchanges its use every `sync_ms` (200 ms here). 4 requests a second (burst 4), sent at 8 a second to
/// each replica for 8 s: about 36 answered in all (alone, each replica would answer about that many — 72).
/// With Redis gone both go on serving, each enforcing the limit alone, and say so.
#[test]
fn a_tenants_rate_holds_across_two_replicas() {
    let port = free_port();
    let redis_proc = redis(port);
    let tenants = format!(
        "tenants=[{{ name = \"shared\", key_sha256 = \"{}\", rate_per_s = 4.0, burst = 4.0 }}]",
        common::key_sha256("sk-shared")
    );
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "policy_store.sync_ms=200",
        "--set",
        "reranker.workers=0",
        "--set",
        &tenants,
    ];
    let a = start(&args);
    let b = start(&args);
    let secs = 8.0;
    let (ta, tb) = (
        std::thread::spawn({
            let base = a.base.clone();
            move || paced(base, "sk-shared", 8.0, secs)
        }),
        std::thread::spawn({
            let base = b.base.clone();
            move || paced(base, "sk-shared", 8.0, secs)
        }),
    );
    let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
    let answered = ra.0 + rb.0;
    // Expected: rate × time + burst = 36; the tolerance (N − 1) × (burst + rate × sync) ≈ 5 more.
    assert!(
        (28..=46).contains(&answered),
        "answered {answered} (A {ra:?}, B {rb:?})"
    );
    assert!(ra.0 > 4 && rb.0 > 4, "both replicas answer: {ra:?} {rb:?}");
    let shared = |base: &str, v: &str| {
        ureq::get(&format!("{base}/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap()
            .contains(&format!("tiergate_tenant_limits_shared {v}"))
    };
    assert!(shared(&a.base, "1"));
    println!("shared rate 4/s over 2 replicas, 8 s: answered {answered} (A {ra:?}, B {rb:?})");

    // Redis gone: each replica enforces the rate alone, still answering, and says so.
    drop(redis_proc);
    let t = Instant::now();
    while !shared(&a.base, "0") {
        assert!(t.elapsed() < Duration::from_secs(10), "no metric change");
        std::thread::sleep(Duration::from_millis(100));
    }
    let alone = paced(a.base.clone(), "sk-shared", 8.0, 2.0);
    assert!(alone.0 >= 4, "{alone:?}");
}

/// `GET` (body `None`) or `PATCH` the policy at `path` under `admin`; the status on failure.
fn at(admin: &str, path: &str, body: Option<Value>) -> Result<Value, u16> {
    let url = format!("{admin}{path}");
    let r = match body {
        None => ureq::get(&url).call(),
        Some(b) => ureq::request("PATCH", &url).send_json(b),
    };
    match r {
        Ok(resp) => Ok(resp.into_json().unwrap()),
        Err(ureq::Error::Status(code, _)) => Err(code),
        Err(e) => panic!("{e}"),
    }
}

/// Waits (≤ 2 s) until the policy at `path` under `admin` satisfies `ok`; returns the view.
fn until_2s(admin: &str, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let v = at(admin, path, None).unwrap();
        if ok(&v) {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(2), "not seen in 2 s: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A cascade stage's policy is shared like the routing policy (its own Redis hash, its own versions), and the
/// format each hash carries keeps replicas of two versions apart during a rollout: a policy written without a
/// format (the replicas before stages) is read as format 1; one written in a newer format is neither
/// installed (the stage keeps its policy in force) nor overwritten (409, the stored one stays).
#[test]
fn stage_policies_are_shared_and_a_newer_format_is_neither_misread_nor_overwritten() {
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "policy_store.sync_ms=200",
        "--set",
        "llm=[{ name = \"small\", engine = \"stub\", workers = 0 }, { name = \"big\", engine = \"stub\", workers = 0 }]",
        "--set",
        "routes=[{ name = \"classify\", kind = \"classify\", stages = [\"small\", { llm = \"big\", theta = 0.3 }] }]",
    ];
    let a = start(&args);
    let b = start(&args);
    let stage = "/admin/routing?route=classify&stage=big";
    let key = "tiergate:policy:stage:classify:big";
    let v0 = until_2s(&a.admin, stage, |v| v["version"].as_u64() >= Some(1))["version"]
        .as_u64()
        .unwrap();
    until_2s(&b.admin, stage, |v| v["version"].as_u64() == Some(v0));
    let routing_before = routing(&a.admin)["version"].as_u64();

    // A stage change through A reaches B; the routing policy's version does not move.
    let changed = at(&a.admin, stage, Some(json!({"theta_base": 0.33}))).unwrap();
    assert_eq!(changed["version"].as_u64(), Some(v0 + 1));
    let seen = until_2s(&b.admin, stage, |v| v["version"].as_u64() == Some(v0 + 1));
    assert_eq!(seen["theta_base"].as_f64(), Some(0.33));
    assert_eq!(redis_cli(port, &["HGET", key, "format"]), "3");
    assert_eq!(routing(&b.admin)["version"].as_u64(), routing_before);

    // Written without a format, as the replicas before this one write the routing policy: read as format 1.
    let mut policy: Value =
        serde_json::from_str(&redis_cli(port, &["HGET", key, "policy"])).unwrap();
    policy["theta_base"] = json!(0.44);
    redis_cli(port, &["HDEL", key, "format"]);
    redis_cli(
        port,
        &[
            "HSET",
            key,
            "version",
            &(v0 + 2).to_string(),
            "policy",
            &policy.to_string(),
        ],
    );
    for s in [&a, &b] {
        let v = until_2s(&s.admin, stage, |v| v["version"].as_u64() == Some(v0 + 2));
        assert_eq!(v["theta_base"].as_f64(), Some(0.44));
    }

    // A newer format (a field this replica does not know): not installed, not overwritten.
    policy["a_field_from_the_future"] = json!(true);
    redis_cli(
        port,
        &[
            "HSET",
            key,
            "version",
            &(v0 + 3).to_string(),
            "policy",
            &policy.to_string(),
            "format",
            "4",
        ],
    );
    std::thread::sleep(Duration::from_millis(800));
    for s in [&a, &b] {
        let v = at(&s.admin, stage, None).unwrap();
        assert_eq!(v["version"].as_u64(), Some(v0 + 2), "{v}");
        assert_eq!(
            at(&s.admin, stage, Some(json!({"theta_base": 0.5}))),
            Err(409)
        );
    }
    assert_eq!(redis_cli(port, &["HGET", key, "format"]), "4");
    assert_eq!(
        redis_cli(port, &["HGET", key, "version"]),
        (v0 + 3).to_string()
    );
    // The routing policy is unaffected and still changes.
    assert!(patch(&a.admin, json!({"k": 0.2}), None).is_ok());
}

/// With the policy store in Redis, decision records live there too: an answer from replica A takes feedback
/// through replica B (the first stands on either), an audit drawn on A is listed and labelled on B, and both
/// report the same silent error; a record's TTL is the feedback window.
#[test]
fn feedback_and_audits_join_across_replicas_through_redis() {
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "routing.audit_rate=1.0",
        "--set",
        "feedback.window_s=3600",
    ];
    let a = start(&args);
    let b = start(&args);
    let answer: Value = ureq::post(&format!("{}/v1/chat/completions", a.base))
        .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "I lost my card"}]}))
        .unwrap()
        .into_json()
        .unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    let answered = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let feedback = |base: &str, body: Value| -> Value {
        match ureq::post(&format!("{base}/v1/feedback")).send_json(body) {
            Ok(r) => r.into_json().unwrap(),
            Err(ureq::Error::Status(code, r)) => panic!("{code}: {}", r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let v = feedback(&b.base, json!({"id": id, "label": answered}));
    assert_eq!(
        (v["correct"].as_bool(), v["duplicate"].as_bool()),
        (Some(true), Some(false)),
        "{v}"
    );
    let v = feedback(&a.base, json!({"id": id, "correct": false}));
    assert_eq!(
        (v["correct"].as_bool(), v["duplicate"].as_bool()),
        (Some(true), Some(true)),
        "{v}"
    );
    let ttl: i64 = redis_cli(port, &["TTL", &format!("tiergate:policy:ledger:d:{id}")])
        .parse()
        .unwrap();
    assert!(
        ttl > 3500 && ttl <= 3600,
        "the record's TTL is the window: {ttl}"
    );

    // The audit drawn on A, labelled on B.
    let items: Value = ureq::get(&format!("{}/admin/audits?route=classify", b.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let item = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{items}"))
        .clone();
    assert_eq!(item["text"], "I lost my card");
    // Counted as pending for the head that answered (Redis keeps the pending ids per head).
    let sum: Value = ureq::get(&format!("{}/admin/feedback", b.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(
        sum["routes"]["classify"]["audits"]["pending"].as_u64(),
        Some(1),
        "{sum}"
    );
    assert_eq!(
        sum["routes"]["classify"]["audits"]["other_heads_pending"].as_u64(),
        Some(0)
    );
    let v: Value = ureq::post(&format!("{}/admin/audits/{id}", b.admin))
        .send_json(json!({"label": answered}))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(v["wrong"].as_bool(), Some(false), "{v}");
    // Everything the ledger wrote expires within the window: the record, the feedback, the audit (labelled
    // now), its label, and every per-route set and counter (`TTL` is -1 for a key that never expires).
    let keys = redis_cli(port, &["KEYS", "tiergate:policy:ledger:*"]);
    let keys: Vec<&str> = keys.lines().collect();
    for want in [
        "d:",
        "fb:",
        "audit:",
        "label:",
        "stats:",
        "labelled:",
        "routes",
    ] {
        assert!(
            keys.iter().any(|k| k.contains(&format!("ledger:{want}"))),
            "no {want} key in {keys:?}"
        );
    }
    for k in &keys {
        let ttl: i64 = redis_cli(port, &["TTL", k]).parse().unwrap();
        assert!(ttl > 3500 && ttl <= 3600, "{k} has TTL {ttl}");
    }
    for s in [&a, &b] {
        let sum: Value = ureq::get(&format!("{}/admin/feedback", s.admin))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let c = &sum["routes"]["classify"];
        assert_eq!(c["audits"]["labelled"].as_u64(), Some(1), "{sum}");
        assert_eq!(c["audits"]["pending"].as_u64(), Some(0), "{sum}");
        assert_eq!(c["silent_error"]["estimate"].as_f64(), Some(0.0));
        // A server without tenants trusts no feedback: it is reported apart, never in `n` or `accuracy`.
        assert_eq!(c["feedback"]["tier0"]["untrusted_n"].as_u64(), Some(1));
        assert_eq!(c["feedback"]["tier0"]["n"].as_u64(), Some(0));
        assert!(c["feedback"]["tier0"]["accuracy"].is_null(), "{sum}");
    }

    // `mode = "risk"` is a policy like the others: set on A, in force on B (format 3 in the hash).
    let before = routing(&b.admin)["version"].as_u64().unwrap();
    patch(
        &a.admin,
        json!({"mode": "risk", "max_error": 0.05, "on_breach": "reject"}),
        None,
    )
    .unwrap();
    let v = seen_within_2s(&b.admin, before + 1);
    assert_eq!(
        (v["mode"].as_str(), v["max_error"].as_f64()),
        (Some("risk"), Some(0.05)),
        "{v}"
    );
    assert!(v["risk"]["classify"]["theta"].is_number(), "{v}");
    assert_eq!(redis_cli(port, &["HGET", "tiergate:policy", "format"]), "3");
    // The audit labelled on B is live evidence for the bound on A too (read from Redis every 2 s).
    let t = Instant::now();
    loop {
        let v = routing(&a.admin);
        if v["risk"]["classify"]["n_audits"].as_u64() == Some(1) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(6), "{v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Trains a head on the project's workload (real MiniLM, f32) with `seed`: heads of the same labels and other
/// weights.
fn train_head(out: &std::path::Path, seed: &str) {
    let t = Command::new(tiergate_tests::binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(tiergate_tests::minilm_dir())
        .arg("--data")
        .arg(tiergate_tests::root().join("bench/workloads/bank24.jsonl"))
        .arg("--out")
        .arg(out)
        .args([
            "--dev-fraction",
            "0.25",
            "--precision",
            "f32",
            "--seed",
            seed,
        ])
        .output()
        .unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
}

fn head_of(base: &str) -> String {
    chat_header(base, "x-tiergate-head-version").1
}

/// Asks `base` until its answers name head `version` (10 s at most: a replica loads the head before it swaps).
fn answers_with(base: &str, version: &str) {
    let t = Instant::now();
    while head_of(base) != version {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{base} never answered with head {version}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A head promoted on replica A (checked in shadow there) is published through the real Redis: replica B
/// adopts it from the same folder and its answers name it; A's rollback reaches B too. A promoted head whose
/// folder a replica lacks leaves that replica on its own head, saying so in `tiergate_head_behind`, and
/// `/ready` stays 200.
#[test]
fn a_promoted_head_is_shared_through_redis_and_a_replica_without_its_files_keeps_its_own() {
    let work = tempfile::tempdir().unwrap();
    let (h0, h1) = (work.path().join("h0"), work.path().join("h1"));
    train_head(&h0, "1");
    train_head(&h1, "2");
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let head = format!(
        "prefilter.head={{kind=\"trained\", dir=\"{}\"}}",
        h0.display()
    );
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "policy_store.sync_ms=200",
        "--set",
        &head,
        "--set",
        "prefilter.precision=\"f32\"",
        "--set",
        "reranker.workers=0",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        // The checks are the in-process tests' (server/tests/heads.rs); here the swap's sharing is.
        "--set",
        "heads.max_accuracy_drop=1.0",
        "--set",
        "heads.max_p50_ratio=100.0",
    ];
    let a = start(&args);
    let b = start(&args);
    let v0 = head_of(&a.base);
    assert_eq!(head_of(&b.base), v0);
    let holdout = tiergate_tests::root().join("bench/workloads/bank24.jsonl");
    let r: Value = ureq::post(&format!("{}/admin/heads/classify", a.admin))
        .send_json(json!({"dir": h1, "requests": 5, "holdout": holdout}))
        .unwrap()
        .into_json()
        .unwrap();
    let v1 = r["version"].as_str().unwrap().to_string();
    assert_ne!(v1, v0);
    answers_with(&a.base, &v1);
    answers_with(&b.base, &v1);
    let hb: Value = ureq::get(&format!("{}/admin/heads", b.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert!(
        hb["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "adopted" && e["version"] == v1.as_str()),
        "{hb}"
    );

    // A's rollback reaches B.
    ureq::post(&format!("{}/admin/heads/classify/rollback", a.admin))
        .call()
        .unwrap();
    answers_with(&a.base, &v0);
    answers_with(&b.base, &v0);

    // A head promoted elsewhere whose folder this machine lacks.
    let stored =
        json!({"version": "feedfacefeedface", "dir": work.path().join("elsewhere"), "at_ms": 0});
    assert_eq!(
        redis_cli(
            port,
            &["SET", "tiergate:policy:head:classify", &stored.to_string()]
        ),
        "OK"
    );
    for s in [&a, &b] {
        let t = Instant::now();
        loop {
            let m = ureq::get(&format!("{}/metrics", s.base))
                .call()
                .unwrap()
                .into_string()
                .unwrap();
            if m.contains("tiergate_head_behind{route=\"classify\"} 1") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{m}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(head_of(&s.base), v0, "it keeps its own head");
        assert_eq!(
            ureq::get(&format!("{}/ready", s.base))
                .call()
                .unwrap()
                .status(),
            200
        );
    }
}

/// Sends classify requests to both replicas until each has a verdict (an event other than `shadow`) for its
/// own candidate; returns those events.
fn verdicts(pairs: &[(&common::Server, &str)]) -> Vec<Value> {
    let t = Instant::now();
    loop {
        let mut found = Vec::new();
        for (s, version) in pairs {
            let _ = chat_version(&s.base);
            let h: Value = ureq::get(&format!("{}/admin/heads", s.admin))
                .call()
                .unwrap()
                .into_json()
                .unwrap();
            found.extend(
                h["history"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["version"] == *version && e["action"] != "shadow")
                    .cloned(),
            );
        }
        if found.len() == pairs.len() {
            return found;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no verdicts yet: {found:?}"
        );
    }
}

/// Two replicas promote different heads at once through a real Redis: the shared record is written
/// compare-and-set, so one wins and the other is refused, saying why, and both end on the winner. Then a
/// rollback is followed by a replica that never held the head it returns to: the rollback publishes that
/// head's folder.
#[test]
fn two_replicas_promoting_at_once_one_wins_and_a_rollback_reaches_a_replica_that_never_held_its_head(
) {
    let work = tempfile::tempdir().unwrap();
    let (h0, h1, h2) = (
        work.path().join("h0"),
        work.path().join("h1"),
        work.path().join("h2"),
    );
    train_head(&h0, "1");
    train_head(&h1, "2");
    train_head(&h2, "3");
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let head = format!(
        "prefilter.head={{kind=\"trained\", dir=\"{}\"}}",
        h0.display()
    );
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "policy_store.sync_ms=200",
        "--set",
        &head,
        "--set",
        "prefilter.precision=\"f32\"",
        "--set",
        "reranker.workers=0",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "heads.max_accuracy_drop=1.0",
        "--set",
        "heads.max_p50_ratio=100.0",
    ];
    let a = start(&args);
    let b = start(&args);
    let v0 = head_of(&a.base);
    let holdout = tiergate_tests::root().join("bench/workloads/bank24.jsonl");
    let begin = |s: &common::Server, dir: &std::path::Path| -> String {
        let r: Value = ureq::post(&format!("{}/admin/heads/classify", s.admin))
            .send_json(json!({"dir": dir, "requests": 5, "holdout": holdout}))
            .unwrap()
            .into_json()
            .unwrap();
        r["version"].as_str().unwrap().to_string()
    };
    let (v1, v2) = (begin(&a, &h1), begin(&b, &h2));
    let ends = verdicts(&[(&a, &v1), (&b, &v2)]);
    let promoted: Vec<&Value> = ends.iter().filter(|e| e["action"] == "promoted").collect();
    assert_eq!(promoted.len(), 1, "exactly one wins: {ends:?}");
    let lost = ends.iter().find(|e| e["action"] != "promoted").unwrap();
    assert_eq!(lost["action"], "refused", "{lost}");
    let why = lost["reason"].as_str().unwrap();
    assert!(
        why.contains("another replica put head") || why.contains("slot was cleared"),
        "the loser is told: {why}"
    );
    let (winner, other_dir, won) = if promoted[0]["version"] == v1.as_str() {
        (&a, &h2, v1.clone())
    } else {
        (&b, &h1, v2.clone())
    };
    answers_with(&a.base, &won);
    answers_with(&b.base, &won);

    // The winner promotes the other head; a third replica starts and adopts it, never holding `won`.
    let next = begin(winner, other_dir);
    assert_eq!(verdicts(&[(winner, &next)])[0]["action"], "promoted");
    let c = start(&args);
    answers_with(&c.base, &next);
    // The rollback returns to `won` and publishes its folder: c loads it.
    let r = ureq::post(&format!("{}/admin/heads/classify/rollback", winner.admin))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    for s in [&a, &b, &c] {
        answers_with(&s.base, &won);
    }
    assert_ne!(won, v0);
}

/// With the Redis policy store, stored responses live in Redis: a response made on replica A is retrieved and
/// continued on replica B, for its tenant only, and its key carries the TTL.
#[test]
fn a_stored_response_is_continued_on_another_replica() {
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}, {{ name = \"b\", key_sha256 = \"{}\" }}]",
        common::key_sha256("key-a"),
        common::key_sha256("key-b")
    );
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        &tenants,
        "--set",
        "responses.store=true",
        "--set",
        "responses.ttl_s=600",
    ];
    let a = start(&args);
    let b = start(&args);
    let post = |base: &str, key: &str, body: Value| -> (u16, Value) {
        match ureq::post(&format!("{base}/v1/responses"))
            .set("authorization", &format!("Bearer {key}"))
            .send_json(body)
        {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let (code, first) = post(
        &a.base,
        "key-a",
        json!({"model": "generate", "input": "hello there", "max_output_tokens": 8}),
    );
    assert_eq!(code, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    assert_eq!(first["store"], true);
    // The write is in the background: B finds it within a moment.
    let t = Instant::now();
    let got = loop {
        let r = ureq::get(&format!("{}/v1/responses/{id}", b.base))
            .set("authorization", "Bearer key-a")
            .call();
        match r {
            Ok(r) => break r.into_json::<Value>().unwrap(),
            Err(ureq::Error::Status(404, _)) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(got["id"], id.as_str());
    let (code, next) = post(
        &b.base,
        "key-a",
        json!({"model": "generate", "input": "and again", "previous_response_id": id, "max_output_tokens": 8}),
    );
    assert_eq!(code, 200, "{next}");
    assert!(
        next["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64(),
        "the continuation carries the first turn: {first} {next}"
    );
    let (code, v) = post(
        &b.base,
        "key-b",
        json!({"model": "generate", "input": "hi", "previous_response_id": id}),
    );
    assert_eq!(code, 400, "another tenant's response: {v}");
    assert_eq!(v["error"]["code"], "previous_response_not_found", "{v}");
    let ttl: i64 = redis_cli(port, &["TTL", &format!("tiergate:policy:responses:{id}")])
        .parse()
        .unwrap();
    assert!(ttl > 500 && ttl <= 600, "TTL {ttl}");
}

/// A steered generate route's θ policy and the session pins are shared through Redis like the rest: a change
/// of `?route=chat` through A reaches B; a session pinned on A (its first turn's budget rules the slow
/// alternative out, so it goes to the fast one) is kept there on B, where the stage would otherwise prefer
/// the slow one; the pin is one key with its TTL, and holds no session key in clear.
#[test]
fn a_steered_routes_policy_and_session_pins_are_shared_across_replicas() {
    let port = free_port();
    let _redis = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "policy_store.sync_ms=200",
        "--set",
        "llm=[{ name = \"slow\", engine = \"stub\", workers = 1, generate_prior_ms = 5000, extra_args = [\"--stub-delay-ms\", \"1500\"] }, \
              { name = \"fast\", engine = \"stub\", workers = 1, generate_prior_ms = 100 }]",
        "--set",
        "routes=[{ name = \"chat\", kind = \"generate\", stages = [{ name = \"s\", any = [\"slow\", \"fast\"] }], \
                 steer = { by_label = { card_not_arrived = \"s\" }, theta = 0.4 } }]",
    ];
    let a = start(&args);
    let b = start(&args);
    let path = "/admin/routing?route=chat";
    until_2s(&b.admin, path, |v| v["version"].as_u64() >= Some(1));
    let changed = at(&a.admin, path, Some(json!({"theta_base": 0.55}))).unwrap();
    let version = changed["version"].as_u64().unwrap();
    let seen = until_2s(&b.admin, path, |v| v["version"].as_u64() == Some(version));
    assert_eq!(seen["theta_base"].as_f64(), Some(0.55));
    assert!(!redis_cli(port, &["HGET", "tiergate:policy:route:chat", "policy"]).is_empty());

    let turn = |base: &str, budget: Option<&str>| {
        let mut r = ureq::post(&format!("{base}/v1/chat/completions"))
            .set("x-session-id", "conversation-42");
        if let Some(ms) = budget {
            r = r.set("x-tiergate-deadline-ms", ms);
        }
        let resp = r
            .send_json(json!({"model": "chat", "messages": [{"role": "user", "content": "where is my card"}]}))
            .unwrap();
        (
            resp.header("x-tiergate-backend").map(str::to_string),
            resp.header("x-tiergate-session").map(str::to_string),
        )
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(turn(&a.base, Some("1000")), (s("fast"), s("new")));
    // A's pin is written to Redis in the background (the turn does not wait for it): B's turn after it lands.
    let t = std::time::Instant::now();
    while redis_cli(port, &["KEYS", "tiergate:policy:pin:*"])
        .trim()
        .is_empty()
    {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "A's pin never reached Redis"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(turn(&b.base, None), (s("fast"), s("kept")));
    let keys = redis_cli(port, &["KEYS", "tiergate:policy:pin:*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    assert!(!keys.contains("conversation-42"), "{keys}");
    let ttl: i64 = redis_cli(port, &["PTTL", keys.trim()]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 1_800_000, "{ttl}");
    // Without the session, B's stage prefers the slow one (listed first).
    let plain = ureq::post(&format!("{}/v1/chat/completions", b.base))
        .send_json(
            json!({"model": "chat", "messages": [{"role": "user", "content": "where is my card"}]}),
        )
        .unwrap();
    assert_eq!(plain.header("x-tiergate-backend"), Some("slow"));
}
