//! The error bound end to end on the real MiniLM and the project's own workload: `tiergate train` stores the
//! held-out calibration rows with the head (no text), `tiergate eval --risk` reports the θ Learn-then-Test
//! chooses on them (recomputed here from the file with `tiergate_core::risk`) and what it does on the data,
//! and the server caps a load-raised θ at the same bound: every answer's `x-tiergate-threshold` is the bound's
//! θ, and requests above it escalate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;

use serde_json::{json, Value};
use tiergate_core::risk::{choose, Row};
use tiergate_tests::{binary, minilm_dir, root};

mod common;
use common::start;

/// `GET /admin/feedback` on the admin listener `admin` with the admin token.
fn admin_feedback(admin: &str, token: &str) -> Value {
    ureq::get(&format!("{admin}/admin/feedback"))
        .set("authorization", &format!("Bearer {token}"))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

fn rows(v: &Value) -> Vec<Row> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| Row {
            ambiguity: r[0].as_f64().unwrap(),
            wrong: r[1].as_bool().unwrap(),
        })
        .collect()
}

#[test]
fn calibration_rows_are_stored_the_bound_is_reported_and_the_server_caps_theta_with_it() {
    let work = tempfile::tempdir().unwrap();
    // The project's two labelled workloads together (342 rows): half of them to dev gives ~85 calibration
    // rows, enough for the bound at ε = 10% to be shown (θ > 0) where bank24 alone (~30) cannot.
    let data = work.path().join("bank24_all.jsonl");
    let mut all = std::fs::read_to_string(root().join("bench/workloads/bank24.jsonl")).unwrap();
    all.push_str(
        &std::fs::read_to_string(root().join("bench/workloads/bank24_more.jsonl")).unwrap(),
    );
    std::fs::write(&data, all).unwrap();
    let head = work.path().join("head");
    let train = Command::new(binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(minilm_dir())
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&head)
        .args(["--dev-fraction", "0.5", "--precision", "f32"])
        .output()
        .unwrap();
    assert!(
        train.status.success(),
        "{}",
        String::from_utf8_lossy(&train.stderr)
    );

    // The dev split in two halves of each label: the temperature's and the held-out calibration rows.
    let text = std::fs::read_to_string(head.join("calibration.json")).unwrap();
    let cal: Value = serde_json::from_str(&text).unwrap();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(head.join("head.json")).unwrap()).unwrap();
    let (ordering, calibration) = (rows(&cal["ordering"]), rows(&cal["rows"]));
    assert_eq!(meta["dev"]["n"].as_u64(), Some(calibration.len() as u64));
    assert_eq!(
        meta["dev"]["temperature_rows"].as_u64(),
        Some(ordering.len() as u64)
    );
    assert!(
        ordering.len().abs_diff(calibration.len()) <= 24,
        "one row per label at most apart"
    );
    let first_text = std::fs::read_to_string(&data).unwrap();
    let first: Value = serde_json::from_str(first_text.lines().next().unwrap()).unwrap();
    assert!(
        !text.contains(first["text"].as_str().unwrap()),
        "no request text"
    );

    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(&head)
        .arg("--data")
        .arg(&data)
        .args([
            "--risk",
            "--confidence",
            "0.8",
            "--json",
            "--coverage",
            "20",
        ])
        .args(["--set", "prefilter.precision=\"f32\""])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let risk = report["risk"].as_array().unwrap();
    let eps: Vec<f64> = risk
        .iter()
        .map(|r| r["max_error"].as_f64().unwrap())
        .collect();
    assert_eq!(eps, [0.01, 0.02, 0.05, 0.10]);
    for r in risk {
        // δ = 1 − confidence = 0.2 (a δ of 0.1 here went unnoticed while every θ was 0).
        let want = choose(
            &ordering,
            &calibration,
            r["max_error"].as_f64().unwrap(),
            1.0 - 0.8,
        );
        assert_eq!(r["theta"].as_f64(), Some(want.theta), "{r}");
        assert_eq!(r["n_calibration"].as_u64(), Some(calibration.len() as u64));
        assert_eq!(r["confidence"].as_f64(), Some(0.8));
        if want.theta == 0.0 {
            assert!(r["note"].is_string(), "θ = 0 says why: {r}");
        } else {
            assert!(r["upper_bound"].as_f64().unwrap() <= r["max_error"].as_f64().unwrap());
        }
        let share = r["escalated_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{r}");
    }
    // 1% on a few dozen rows cannot be shown: θ = 0, escalate everything; 10% can.
    assert_eq!(risk[0]["theta"].as_f64(), Some(0.0));
    assert_eq!(risk[0]["escalated_share"].as_f64(), Some(1.0));
    assert!(risk[3]["theta"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["coverage"].as_array().unwrap().len(), 4);

    // Served under `load` with the LLM fully busy (θ would be 1): the bound caps θ at the ε = 10% choice.
    let theta = risk[3]["theta"].as_f64().unwrap();
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"load\"",
        "--set",
        "routing.theta_base=0.9",
        "--set",
        "routing.utilization_source=\"manual\"",
        "--set",
        "routing.manual_utilization=1.0",
        "--set",
        "routing.max_error=0.1",
        "--set",
        "routing.confidence=0.8",
        "--set",
        "prefilter.precision=\"f32\"",
        "--set",
        "routing.allow_header_override=true",
        "--set",
        "server.admin_token=\"risk-token\"",
        "--set",
        &format!(
            "prefilter.head={{kind=\"trained\", dir=\"{}\"}}",
            head.display()
        ),
    ]);
    // Until the sampler has read the manual utilisation, θ_eff is θ_base.
    let t = std::time::Instant::now();
    let admin = loop {
        let admin: Value = ureq::get(&format!("{}/admin/routing", s.admin))
            .set("authorization", "Bearer risk-token")
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        if admin["utilization_in_use"] == "manual" || t.elapsed().as_secs() > 10 {
            break admin;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(admin["theta_eff"].as_f64(), Some(1.0), "{admin}");
    assert_eq!(
        admin["risk"]["classify"]["theta"].as_f64(),
        Some(theta),
        "{admin}"
    );
    assert_eq!(admin["risk"]["classify"]["theta_eff"].as_f64(), Some(theta));
    assert_eq!(admin["risk"]["classify"]["outside_proof"], false, "{admin}");
    assert!(
        admin["risk"]["classify"]["calibration_flaw"].is_null(),
        "{admin}"
    );
    // Each text twice: under a forced θ = 1 (the operator's override: Tier-0 alone) for Tier-0's own
    // ambiguity, then as a client sends it, decided by the bound's θ.
    let ask = |text: &Value, force: bool| {
        let mut req = ureq::post(&format!("{}/v1/chat/completions", s.base));
        if force {
            req = req
                .set("x-tiergate-threshold", "1")
                .set("x-tiergate-admin-token", "risk-token");
        }
        req.send_json(json!({"model": "classify", "messages": [{"role": "user", "content": text}]}))
            .unwrap()
    };
    let (mut escalated, mut alone) = (0, 0);
    for line in first_text.lines().take(60) {
        let t: Value = serde_json::from_str(line).unwrap();
        let r = ask(&t["text"], true);
        assert_eq!(r.header("x-tiergate-tier"), Some("tier0"));
        let ambiguity = 1.0
            - r.header("x-tiergate-confidence")
                .unwrap()
                .parse::<f64>()
                .unwrap();
        let r = ask(&t["text"], false);
        assert_eq!(
            r.header("x-tiergate-threshold"),
            Some(format!("{theta:.4}").as_str())
        );
        // The header's four decimals: a row within 1e-4 of θ may go either way.
        if (ambiguity - theta).abs() < 1e-4 {
            continue;
        }
        let want = if ambiguity > theta { "llm" } else { "tier0" };
        assert_eq!(
            r.header("x-tiergate-tier"),
            Some(want),
            "ambiguity {ambiguity:.4} against the bound's θ {theta:.4}: {}",
            t["text"]
        );
        match want {
            "llm" => escalated += 1,
            _ => alone += 1,
        }
    }
    // θ is inside the traffic's ambiguities: the bound both keeps answers with Tier-0 and escalates others,
    // so a server that ignored calibration.json (θ = 1 under full load) would fail above.
    assert!(
        escalated > 0 && alone > 0,
        "escalated {escalated}, alone {alone}"
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("tiergate_risk_calibration_flawed{route=\"classify\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tiergate_risk_theta_ratio{route=\"classify\"}"),
        "{metrics}"
    );
}

/// The local ledger is a SQLite file: an answer given just before a shutdown still takes feedback after the
/// restart (the records waiting for the writer are written before the process goes), the first feedback still
/// stands after a second restart, and an id from before the window is unknown.
#[test]
fn feedback_joins_an_answer_from_before_a_restart() {
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("ledger/feedback.sqlite");
    let args = [
        "--set".to_string(),
        format!("feedback.path=\"{}\"", path.display()),
        "--set".to_string(),
        "feedback.window_s=3600".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = start(&args);
    let answer: Value = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "my card has not arrived"}]}))
        .unwrap()
        .into_json()
        .unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    drop(s);
    assert!(path.is_file(), "the ledger is a file");
    let give = |base: &str, body: Value| -> (u16, Value) {
        match ureq::post(&format!("{base}/v1/feedback")).send_json(body) {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let s = start(&args);
    let (code, v) = give(&s.base, json!({"id": id, "correct": false}));
    assert_eq!((code, v["duplicate"].as_bool()), (200, Some(false)), "{v}");
    drop(s);
    let s = start(&args);
    let (code, v) = give(&s.base, json!({"id": id, "correct": true}));
    assert_eq!(
        (code, v["correct"].as_bool(), v["duplicate"].as_bool()),
        (200, Some(false), Some(true)),
        "{v}"
    );
    let (code, v) = give(&s.base, json!({"id": "chatcmpl-never", "correct": true}));
    assert_eq!(code, 404, "{v}");
    assert_eq!(v["error"]["code"], "not_found");
}

/// The LLM's second opinion on audits (`[feedback] audit_llm`), with the real server and a stub worker process
/// whose rerank takes 800 ms, two worker slots (an audit may take one only while the other stays free): a Tier-0 answer drawn for audit is never held up by its
/// scoring (each answer comes well before a scoring job could have ended, also while one runs); an idle LLM
/// scores every audit; while escalations keep a slot busy no audit is scored (each is shed, counted), the
/// escalations all reach the LLM; once they end, scoring resumes. Every audit ends scored or shed, none lost.
#[test]
fn audits_never_delay_a_response_and_stop_while_the_llm_is_busy() {
    const DELAY_MS: u128 = 800;
    let work = tempfile::tempdir().unwrap();
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"800\"]",
        "--set",
        "reranker.max_concurrent=2",
        "--set",
        "reranker.rerank_deadline_ms=10000",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "routing.audit_rate=1.0",
        "--set",
        "routing.allow_header_override=true",
        "--set",
        "server.admin_token=\"audit-token\"",
        "--set",
        "feedback.audit_llm=true",
        "--set",
        &format!(
            "feedback.path=\"{}\"",
            work.path().join("f.sqlite").display()
        ),
    ]);
    let ask = |text: &str, escalate: bool| -> (u128, String) {
        let mut req = ureq::post(&format!("{}/v1/chat/completions", s.base));
        if escalate {
            req = req
                .set("x-tiergate-threshold", "0")
                .set("x-tiergate-admin-token", "audit-token");
        }
        let t = std::time::Instant::now();
        let r = req
            .send_json(
                json!({"model": "classify", "messages": [{"role": "user", "content": text}]}),
            )
            .unwrap();
        let tier = r.header("x-tiergate-tier").unwrap_or("").to_string();
        (t.elapsed().as_millis(), tier)
    };
    let agreement = || -> Value {
        admin_feedback(&s.admin, "audit-token")["routes"]["classify"]["llm_agreement"].clone()
    };
    let n = |a: &Value, k: &str| a[k].as_u64().unwrap_or(0);
    let wait_for = |done: &dyn Fn(&Value) -> bool| -> Value {
        let t = std::time::Instant::now();
        loop {
            let a = agreement();
            if done(&a) || t.elapsed().as_secs() > 20 {
                return a;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };

    // Idle: three Tier-0 answers, each drawn for audit; the second and third arrive while the first is scored.
    for text in [
        "my card has not arrived",
        "how do I top up",
        "exchange rate",
    ] {
        let (ms, tier) = ask(text, false);
        assert_eq!(tier, "tier0");
        assert!(
            ms < DELAY_MS,
            "a Tier-0 answer took {ms} ms: held up by its audit's scoring"
        );
    }
    let a = wait_for(&|a| n(a, "scored") + n(a, "shed") + n(a, "failed") >= 3);
    assert_eq!(
        (n(&a, "scored"), n(&a, "shed"), n(&a, "failed")),
        (3, 0, 0),
        "an idle LLM scores every audit: {a}"
    );
    assert!(a["agreement"].is_number(), "{a}");
    assert!(a["note"].as_str().unwrap().contains("not accuracy"));

    // Busy: three clients keep both slots in escalations (one always waiting); Tier-0 answers drawn for audit
    // meanwhile are shed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (base, tiers) = (
        s.base.clone(),
        std::sync::Arc::new(std::sync::Mutex::new(Vec::new())),
    );
    let load: Vec<_> = (0..3)
        .map(|_| {
            let (stop, base, tiers) = (stop.clone(), base.clone(), tiers.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = ureq::post(&format!("{base}/v1/chat/completions"))
                        .set("x-tiergate-threshold", "0")
                        .set("x-tiergate-admin-token", "audit-token")
                        .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "lost card"}]}))
                        .unwrap();
                    let tier = r.header("x-tiergate-tier").unwrap_or("").to_string();
                    tiers.lock().unwrap().push(tier);
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = agreement();
    for text in ["card lost", "top up", "pin blocked", "refund", "transfer"] {
        let (ms, tier) = ask(text, false);
        assert_eq!(tier, "tier0");
        assert!(ms < DELAY_MS, "a Tier-0 answer under load took {ms} ms");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let busy = wait_for(&|a| n(a, "scored") + n(a, "shed") + n(a, "failed") >= 8);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    assert_eq!(
        n(&busy, "scored"),
        n(&before, "scored"),
        "scored while the LLM was busy: {busy}"
    );
    assert_eq!(
        n(&busy, "shed"),
        5,
        "every audit under load is shed: {busy}"
    );
    let tiers = tiers.lock().unwrap().clone();
    assert!(tiers.len() >= 4, "{tiers:?}");
    assert!(
        tiers.iter().all(|t| t == "llm"),
        "an escalation did not reach the LLM: {tiers:?}"
    );

    // Idle again: scoring resumes.
    let (_, tier) = ask("my card has not arrived", false);
    assert_eq!(tier, "tier0");
    let after = wait_for(&|a| n(a, "scored") > n(&busy, "scored"));
    assert_eq!(n(&after, "scored"), n(&busy, "scored") + 1, "{after}");
    assert_eq!(
        n(&after, "scored") + n(&after, "shed") + n(&after, "failed"),
        9,
        "{after}"
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("tiergate_audit_llm_total{route=\"classify\",result=\"shed\"} 5"),
        "{metrics}"
    );
}

/// The operator's loop from the bench on the project's labelled workload: `tiergate-bench --feedback 0.5
/// --label-audits --drift-at 30` against the real server with every Tier-0 answer audited. The bench labels
/// the server's pending audits with the rows' gold labels (the drifted texts included), posts feedback on about
/// half the answers, and its report follows the server's silent error; what it says it did is what the server
/// holds.
#[test]
fn the_bench_posts_feedback_labels_audits_and_follows_the_silent_error() {
    let work = tempfile::tempdir().unwrap();
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "routing.audit_rate=1.0",
        "--set",
        "server.admin_token=\"op-token\"",
        "--set",
        &format!(
            "feedback.path=\"{}\"",
            work.path().join("f.sqlite").display()
        ),
    ]);
    let report = work.path().join("report.json");
    let out = Command::new(binary("tiergate-bench"))
        .args(["--url", &s.base, "--admin-url", &s.admin])
        .args(["--admin-token", "op-token", "--route", "classify"])
        .arg("--data")
        .arg(root().join("bench/workloads/bank24.jsonl"))
        .args(["--requests", "60", "--concurrency", "2", "--quiet"])
        .args(["--feedback", "0.5", "--label-audits", "--drift-at", "30"])
        .arg("--json")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("silent error (95% CI)"), "{text}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let run = &v["runs"][0];
    let op = &run["operator"];
    assert_eq!(op["label_failed"], 0, "{op}");
    assert_eq!(op["feedback_failed"], 0, "{op}");
    assert_eq!(
        op["audits_unknown"], 0,
        "every audited text, drifted or not, is one the bench sent: {op}"
    );
    let posted = op["feedback_posted"].as_u64().unwrap();
    assert!((15..=45).contains(&posted), "about half of 60: {op}");

    // The last answers' audits may still be on their way to the store when the bench ends.
    let t = std::time::Instant::now();
    let server = loop {
        let v = admin_feedback(&s.admin, "op-token");
        let a = &v["routes"]["classify"]["audits"];
        let n = a["labelled"].as_u64().unwrap_or(0) + a["pending"].as_u64().unwrap_or(0);
        if n >= 60 || t.elapsed().as_secs() > 5 {
            break v;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let c = &server["routes"]["classify"];
    let labelled = c["audits"]["labelled"].as_u64().unwrap();
    assert_eq!(labelled, op["audits_labelled"].as_u64().unwrap(), "{c}");
    assert_eq!(
        labelled + c["audits"]["pending"].as_u64().unwrap(),
        60,
        "every answer audited: {c}"
    );
    assert!(labelled >= 40, "the bench labelled most of them: {c}");
    let fb = &c["feedback"]["tier0"];
    assert_eq!(
        fb["untrusted_n"].as_u64(),
        Some(posted),
        "the feedback the bench posted is the server's: {c}"
    );
    let samples = run["scrape"]["samples"].as_array().unwrap();
    let seen: Vec<u64> = samples
        .iter()
        .filter_map(|x| x["quality"]["audits_labelled"].as_u64())
        .collect();
    assert!(!seen.is_empty(), "{run}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
}
