//! End to end: the real `tiergate serve` process on port 0 with the embedded default config (real MiniLM,
//! stub or real SmolLM2 workers), real HTTP clients, the official `openai` Python package, live policy changes
//! under traffic, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_tests::{binary, root};

mod common;
use common::start;

fn post(base: &str, body: Value) -> (u16, Option<String>, Option<String>, Value) {
    match ureq::post(&format!("{base}/v1/chat/completions")).send_json(body) {
        Ok(r) => {
            let (tier, ver) = (
                r.header("x-tiergate-tier").map(str::to_string),
                r.header("x-tiergate-policy-version").map(str::to_string),
            );
            (r.status(), tier, ver, r.into_json().unwrap_or(Value::Null))
        }
        Err(ureq::Error::Status(code, r)) => {
            (code, None, None, r.into_json().unwrap_or(Value::Null))
        }
        Err(e) => panic!("transport error: {e}"),
    }
}

const STUB: &[&str] = &[
    "--set",
    "reranker.engine=\"stub\"",
    "--set",
    "reranker.extra_args=[\"--stub-delay-ms\", \"20\"]",
];

#[test]
fn serve_answers_with_real_minilm_and_passes_openai_conformance() {
    let s = start(STUB);
    let (code, tier, _, v) = post(
        &s.base,
        json!({"model": "classify", "messages": [{"role": "user", "content": "my card was stolen"}]}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "lost_or_stolen_card");
    assert!(tier.is_some());
    // The utilisation source in use is one the server knows (NVML on a GPU host, the workers' busy time
    // here), and serving works whichever it is.
    let a: Value = ureq::get(&format!("{}/admin/routing", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let source = a["utilization_in_use"].as_str().unwrap_or_default();
    assert!(
        ["nvml", "prometheus", "workers", "manual", "none"].contains(&source),
        "{a}"
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(metrics.contains("tiergate_requests_total"), "{metrics}");
    assert!(metrics.contains("tiergate_theta_eff_ratio"));

    let script = root().join("tests/python/openai_conformance.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&s.base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai conformance failed (is the `openai` package installed? .ci/run installs it):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn policy_changes_live_under_traffic_without_errors() {
    let s = start(STUB);
    let base = s.base.clone();
    let admin = s.admin.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let versions = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut load = Vec::new();
    for i in 0..3 {
        let (base, stop, ok, bad, versions) = (
            base.clone(),
            stop.clone(),
            ok.clone(),
            bad.clone(),
            versions.clone(),
        );
        load.push(std::thread::spawn(move || {
            let texts = ["my card was stolen", "what is the exchange rate", "hmm something odd", "top up failed"];
            let mut k = i;
            while !stop.load(Ordering::SeqCst) {
                let (code, _, ver, _) = post(&base, json!({"model": "classify", "messages": [{"role": "user", "content": texts[k % 4]}]}));
                k += 1;
                if code >= 500 {
                    bad.fetch_add(1, Ordering::SeqCst);
                } else {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(v) = ver {
                    versions.lock().unwrap().insert(v);
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    for theta in [0.3, 0.9, 0.05, 0.65] {
        let r = ureq::request("PATCH", &format!("{admin}/admin/routing"))
            .send_json(json!({"theta_base": theta, "mode": "static"}));
        assert_eq!(r.unwrap().status(), 200);
        std::thread::sleep(Duration::from_millis(200));
    }
    let refused = ureq::request("PATCH", &format!("{admin}/admin/routing"))
        .send_json(json!({"theta_min": 0.9, "theta_max": 0.1}));
    assert!(matches!(refused, Err(ureq::Error::Status(400, _))));
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.join().unwrap();
    }
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "5xx under live policy changes"
    );
    assert!(ok.load(Ordering::SeqCst) > 10);
    let seen = versions.lock().unwrap().clone();
    assert!(
        seen.len() >= 3,
        "version header changed under traffic: {seen:?}"
    );
    let a: Value = ureq::get(&format!("{admin}/admin/routing"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(a["version"], 5, "4 accepted changes, the bad one refused");
}

#[test]
fn sigterm_drains_stops_workers_and_removes_the_segment() {
    let mut s = start(STUB);
    let pid = s.child.id();
    let info: Value = ureq::get(&format!("{}/info", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let segment = format!("/dev/shm/{}", info["segment"].as_str().unwrap());
    assert!(std::path::Path::new(&segment).exists(), "{segment}");
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(
        !std::path::Path::new(&segment).exists(),
        "segment left behind"
    );
}

#[test]
fn real_smollm2_behind_serve_generates_and_reranks() {
    let s = start(&[
        "--set",
        "reranker.max_concurrent=2",
        "--set",
        "routing.allow_header_override=true",
        "--set",
        "server.admin_token=\"e2e-admin-token\"",
    ]);
    let (code, tier, _, v) = post(
        &s.base,
        json!({"model": "generate", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(tier.as_deref(), Some("llm"));
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .trim()
        .is_empty());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    let req = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .set("x-tiergate-threshold", "0")
        .set("x-tiergate-admin-token", "e2e-admin-token");
    let r = req.send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "What is the exchange rate for euros?"}]})).unwrap();
    assert_eq!(
        r.header("x-tiergate-tier"),
        Some("llm"),
        "degraded: {:?}",
        r.header("x-tiergate-degraded")
    );
    assert!(r.header("server-timing").unwrap().contains("rerank;dur="));
    // A JSON Schema is passed on to mistralrs's constrained decoding (not set aside): the answer follows it.
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "blue"]}},
                        "required": ["color"], "additionalProperties": false});
    let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .send_json(json!({"model": "generate", "max_tokens": 24, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
            "messages": [{"role": "user", "content": "Pick a color."}]}))
        .unwrap();
    assert!(
        r.header("x-tiergate-set-aside").is_none(),
        "{:?}",
        r.header("x-tiergate-set-aside")
    );
    let v: serde_json::Value = r.into_json().unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let answer: serde_json::Value = serde_json::from_str(text.trim()).expect(text);
    assert!(
        answer["color"] == "red" || answer["color"] == "blue",
        "{answer}"
    );
}

/// `tiergate-bench` against the real server (real MiniLM, stub LLM worker process): channels from the real
/// headers, the real /admin/routing scraped and driven by --compare, and the policy restored afterwards.
#[test]
fn bench_drives_the_real_server_and_compares_policies() {
    let s = start(STUB);
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("bench.json");
    let data = root().join("bench/workloads/bank24.jsonl");
    let out = Command::new(binary("tiergate-bench"))
        .args(["--url", &s.base, "--data", data.to_str().unwrap()])
        .args(["--admin-url", &s.admin])
        .args([
            "--rate",
            "40",
            "--requests",
            "80",
            "--compare",
            "--quiet",
            "--seed",
            "5",
        ])
        .args(["--json", json_path.to_str().unwrap()])
        .env_remove("TIERGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(r["route"], "classify");
    let rows = r["comparison"].as_array().unwrap();
    let share = |i: usize| rows[i]["escalation_share"].as_f64().unwrap();
    assert_eq!(share(0), 0.0, "tier0-only escalates nothing: {rows:?}");
    assert!(
        share(1) > 0.9,
        "llm-only escalates (nearly) everything: {rows:?}"
    );
    assert!(share(3) < share(1), "{rows:?}");
    for run in r["runs"].as_array().unwrap() {
        assert_eq!(run["requests"], 80);
        let ch = |n: &str| {
            run["channels"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["channel"] == n)
                .unwrap()
                .clone()
        };
        assert_eq!(ch("errors")["count"], 0, "{}", run["name"]);
        assert_eq!(ch("untiered")["count"], 0);
        assert!(!run["scrape"]["samples"].as_array().unwrap().is_empty());
    }
    // Tier-0 alone on the bench workload: the encoder knows these intents.
    assert!(rows[0]["accuracy"].as_f64().unwrap() >= 0.8, "{rows:?}");
    // The server's own policy is back.
    let v: Value = ureq::get(&format!("{}/admin/routing", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(v["mode"], "load");
    assert_eq!(v["theta_base"].as_f64(), Some(0.65));
}

/// Out of scope end to end on the real MiniLM: `tiergate train --oos-label` on the project's 24 intents plus its
/// own out-of-scope queries (`bench/workloads/out_of_scope.jsonl`), then `tiergate serve` with a route that
/// declares the outcome and takes the fitted threshold: a query about the weather (in neither file) is
/// answered out of scope at Tier-0, a card question gets its label, and the metrics count the channel.
#[test]
fn a_trained_head_answers_out_of_scope_through_serve() {
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data.jsonl");
    let mut rows = std::fs::read_to_string(root().join("bench/workloads/bank24.jsonl")).unwrap();
    rows.push_str(
        &std::fs::read_to_string(root().join("bench/workloads/out_of_scope.jsonl")).unwrap(),
    );
    std::fs::write(&data, rows).unwrap();
    let head = work.path().join("head");
    let out = Command::new(binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(tiergate_tests::minilm_dir())
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&head)
        .args(["--dev-fraction", "0.25", "--oos-label", "out_of_scope"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fit: Value =
        serde_json::from_slice(&std::fs::read(head.join("oos.json")).unwrap()).unwrap();
    assert_eq!(
        (fit["method"].as_str(), fit["dev_oos_rows"].as_u64()),
        (Some("knn_top_labels"), Some(10)),
        "{fit}"
    );
    // 10 of 10 measured; held-out rows, so a regression shows here.
    assert!(fit["dev_oos_recall"].as_f64().unwrap() >= 0.7, "{fit}");
    let route = format!(
        "routes=[{{ name = \"bank\", kind = \"classify\", head = {{ kind = \"trained\", dir = \"{}\" }}, \
         out_of_scope = {{ label = \"out_of_scope\" }} }}]",
        head.display()
    );
    let s = start(&["--set", &route, "--set", "reranker.workers=0"]);
    let ask = |text: &str| {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .send_json(
                json!({"model": "bank", "messages": [{"role": "user", "content": text}],
                              "response_format": {"type": "json_object"}}),
            )
            .unwrap();
        let flagged = r.header("x-tiergate-out-of-scope") == Some("1");
        let score: f64 = r.header("x-tiergate-oos-score").unwrap().parse().unwrap();
        let v: Value = r.into_json().unwrap();
        let content: Value =
            serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
        (flagged, score, content)
    };
    let (flagged, score, v) = ask("is it going to snow in paris next week");
    assert!(
        flagged && v["label"] == "out_of_scope" && v["out_of_scope"] == true,
        "{score} {v}"
    );
    let (flagged, score, v) = ask("someone stole my bank card");
    assert!(!flagged && v["label"] != "out_of_scope", "{score} {v}");
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(metrics.contains("channel=\"out_of_scope\""), "{metrics}");
    // The score's distribution, what the threshold is tuned against.
    assert!(
        metrics.contains("tiergate_oos_score_bucket{route=\"bank\""),
        "{metrics}"
    );
}

/// Tenant keys end to end: `tiergate serve` with two `[[tenants]]` (their keys' SHA-256 computed here, as an
/// operator would with `sha256sum`), driven by the official `openai` package: a key works unchanged, a wrong
/// key is its AuthenticationError, a key over its rate is its RateLimitError, and its retries honour
/// Retry-After.
#[test]
fn tenants_through_the_official_openai_client() {
    let sha = common::key_sha256;
    let tenants = format!(
        "tenants=[{{ name = \"open\", key_sha256 = \"{}\" }}, \
         {{ name = \"limited\", key_sha256 = \"{}\", rate_per_s = 1.0, burst = 1.0 }}]",
        sha("sk-open-1"),
        sha("sk-limited-2")
    );
    let s = start(&["--set", &tenants, "--set", "reranker.workers=0"]);
    let out = Command::new("python3")
        .arg(root().join("tests/python/openai_tenants.py"))
        .args([&s.base, "sk-open-1", "sk-limited-2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Without a key, even /v1/models is 401; probes stay open.
    match ureq::get(&format!("{}/v1/models", s.base)).call() {
        Err(ureq::Error::Status(401, _)) => {}
        other => panic!("expected 401, got {other:?}"),
    }
    assert_eq!(
        ureq::get(&format!("{}/ready", s.base))
            .call()
            .unwrap()
            .status(),
        200
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("tenant=\"open\"") && metrics.contains("tenant=\"limited\""),
        "{metrics}"
    );
}

/// SIGHUP reloads the keys file of a running `tiergate serve`: the new key works, the removed one gets 401.
#[test]
fn sighup_reloads_the_keys_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.toml");
    let write = |name: &str, key: &str| {
        let digest = common::key_sha256(key);
        std::fs::write(
            &file,
            format!("[[tenants]]\nname = \"{name}\"\nkey_sha256 = \"{digest}\"\n"),
        )
        .unwrap();
    };
    write("first", "sk-first");
    let set = format!("tenants_file=\"{}\"", file.display());
    let s = start(&["--set", &set, "--set", "reranker.workers=0"]);
    let status = |key: &str| match ureq::get(&format!("{}/v1/models", s.base))
        .set("authorization", &format!("Bearer {key}"))
        .call()
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!((status("sk-first"), status("sk-second")), (200, 401));
    write("second", "sk-second");
    unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    let t = Instant::now();
    while status("sk-second") != 200 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "SIGHUP did not reload the keys"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status("sk-first"), 401);
}

/// The brownout ladder on the real server, driven by the utilisation an operator sets (`manual`): it steps
/// down one step at a time as the pressure passes each `enter` for `hold_ms`, each step visible in
/// `x-tiergate-brownout` and the metrics — `rerank_only`: generations 429 with Retry-After, an answer route its
/// reranked label's reply; `tier0_only`: no escalation — and climbs back once the pressure stays below
/// `leave` for `cool_ms`. The LLM side's pressure alone never sheds (`shed`, 429, is for the server's own load:
/// unit-tested in `engine/src/load/brownout.rs`).
#[test]
fn the_brownout_ladder_steps_down_and_back_up() {
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
        "--set",
        "routing.theta_min=0.0",
        "--set",
        "routing.utilization_source=\"manual\"",
        "--set",
        "routing.manual_utilization=0.0",
        "--set",
        "brownout={ enabled = true, enter = [0.3, 0.5, 0.7], leave = [0.2, 0.4, 0.6], hold_ms = 500, cool_ms = 1000 }",
    ]);
    let ask = |model: &str| -> (
        u16,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base)).send_json(
            json!({"model": model, "messages": [{"role": "user", "content": "my card was stolen"}]}),
        );
        let h = |r: &ureq::Response, k: &str| r.header(k).map(str::to_string);
        match r {
            Ok(r) => (
                r.status(),
                h(&r, "x-tiergate-brownout"),
                h(&r, "x-tiergate-tier"),
                h(&r, "x-tiergate-degraded"),
                None,
            ),
            Err(ureq::Error::Status(code, r)) => (
                code,
                h(&r, "x-tiergate-brownout"),
                None,
                None,
                h(&r, "retry-after"),
            ),
            Err(e) => panic!("{e}"),
        }
    };
    let set_u = |u: f64| {
        ureq::request("PATCH", &format!("{}/admin/routing", s.admin))
            .send_json(json!({"manual_utilization": u}))
            .unwrap();
    };
    let wait_step = |step: Option<&str>| {
        let t = Instant::now();
        loop {
            let got = ask("classify").1;
            if got.as_deref() == step {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "still {got:?}, want {step:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (code, step, tier, _, _) = ask("classify");
    assert_eq!((code, step, tier.as_deref()), (200, None, Some("llm")));
    set_u(0.35);
    wait_step(Some("rerank_only"));
    let (code, _, _, _, retry) = ask("generate");
    assert_eq!((code, retry.as_deref()), (429, Some("5")));
    let (code, _, _, degraded, _) = ask("answer");
    assert_eq!((code, degraded.as_deref()), (200, Some("brownout")));
    assert_eq!(
        ask("classify").2.as_deref(),
        Some("llm"),
        "reranks still run"
    );
    set_u(0.55);
    wait_step(Some("tier0_only"));
    let (_, _, tier, degraded, _) = ask("classify");
    assert_eq!(
        (tier.as_deref(), degraded.as_deref()),
        (Some("tier0"), Some("brownout"))
    );
    // Past shed's `enter` on the LLM side only: Tier-0 goes on answering (three times `hold_ms` later).
    set_u(0.75);
    std::thread::sleep(Duration::from_millis(1500));
    let (code, step, tier, _, _) = ask("classify");
    assert_eq!(
        (code, step.as_deref(), tier.as_deref()),
        (200, Some("tier0_only"), Some("tier0"))
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(metrics.contains("tiergate_brownout_step 2"), "{metrics}");
    // Pressure gone: back up a step per cool-down, to normal.
    set_u(0.0);
    wait_step(None);
    assert_eq!(ask("generate").0, 200);
}

/// Under brownout a cascade sheds its later stages first: with two stub backends and every request escalated,
/// the answers come from the second stage at `normal`, from the first once the ladder is at `rerank_only`.
#[test]
fn under_brownout_a_cascade_sheds_its_later_stage_first() {
    let s = start(&[
        "--set",
        "llm=[{ name = \"small\", engine = \"stub\", workers = 1 }, { name = \"big\", engine = \"stub\", workers = 1 }]",
        "--set",
        "routes=[{ name = \"classify\", kind = \"classify\", stages = [\"small\", { llm = \"big\", theta = 0.0 }] }]",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
        "--set",
        "routing.theta_min=0.0",
        "--set",
        "routing.utilization_source=\"manual\"",
        "--set",
        "routing.manual_utilization=0.0",
        "--set",
        "brownout={ enabled = true, enter = [0.3, 0.5, 0.7], leave = [0.2, 0.4, 0.6], hold_ms = 300, cool_ms = 300 }",
    ]);
    let stage = || -> (Option<String>, Option<String>) {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "my card was stolen"}]}))
            .unwrap();
        (
            r.header("x-tiergate-backend").map(str::to_string),
            r.header("x-tiergate-brownout").map(str::to_string),
        )
    };
    let until = |want: (Option<&str>, Option<&str>)| {
        let t = Instant::now();
        loop {
            let got = stage();
            if (got.0.as_deref(), got.1.as_deref()) == want {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "still {got:?}, want {want:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Both backends up: the second stage answers.
    until((Some("big"), None));
    ureq::request("PATCH", &format!("{}/admin/routing", s.admin))
        .send_json(json!({"manual_utilization": 0.35}))
        .unwrap();
    until((Some("small"), Some("rerank_only")));
}

/// A config file replaces the embedded default, it is not layered over it: `serve --config` with a file that
/// holds only `[[llm]]` (as a user adding a backend might write) fails at once saying so and what the file
/// lacks; `tiergate config --default` prints the default to start from, and `config --check` accepts it with
/// that backend added.
#[test]
fn a_config_file_replaces_the_default_and_a_partial_one_is_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join("llm.toml");
    let backend = "\n[[llm]]\nname = \"small\"\nengine = \"stub\"\n";
    std::fs::write(&partial, backend).unwrap();
    let out = Command::new(binary("tiergate"))
        .current_dir(root())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&partial)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("replaces the embedded default config"),
        "{err}"
    );
    assert!(err.contains("`prefilter.head`"), "{err}");
    let default = Command::new(binary("tiergate"))
        .args(["config", "--default"])
        .output()
        .unwrap();
    assert!(default.status.success());
    let full = dir.path().join("full.toml");
    let mut text = String::from_utf8(default.stdout).unwrap();
    text.push_str(backend);
    std::fs::write(&full, text).unwrap();
    let check = Command::new(binary("tiergate"))
        .current_dir(root())
        .args(["config", "--check"])
        .arg(&full)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("valid (3 routes, 1 LLM backends)"),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// The bench's token rates mean what the SLO means: against the real server (stub worker process, each
/// generation's tokens spread over 1.2 s), a mixed run of label answers (`classify`, Tier-0, nothing escalated)
/// and streamed generations reports each generating stream's decode rate (label answers left out) and checks
/// the "≥ 60 tok/s a stream" line on it, the aggregate being a reported row of its own; a second run whose
/// timeout falls mid-generation names each request it gave up on with what the server had sent by then.
#[test]
fn bench_reports_per_stream_decode_and_names_what_it_gave_up_on() {
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"1200\"]",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "routing.theta_max=1.0",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let generation = "{\"text\": \"one two three four five six seven\", \"route\": \"generate\"}\n";
    let mixed = dir.path().join("mixed.jsonl");
    let label = "{\"text\": \"my card was stolen\", \"route\": \"classify\"}\n";
    std::fs::write(&mixed, format!("{label}{generation}")).unwrap();
    let generations = dir.path().join("generations.jsonl");
    std::fs::write(&generations, generation).unwrap();
    let run = |data: &std::path::Path, timeout: &str, json: &str| -> (String, Value) {
        let path = dir.path().join(json);
        let out = Command::new(binary("tiergate-bench"))
            .args(["--url", &s.base, "--data", data.to_str().unwrap()])
            .args(["--concurrency", "2", "--requests", "8", "--stream"])
            .args(["--timeout", timeout])
            .args(["--json", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        (stdout, r["runs"][0].clone())
    };
    let (text, r) = run(&mixed, "30s", "done.json");
    let channel = |name: &str| {
        r["channels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["channel"] == name)
            .unwrap()
            .clone()
    };
    let served = channel("served");
    assert_eq!(served["count"], 8, "{r}");
    // The generations (the LLM's channel) are the streams with a decode rate: 8 tokens over ~1.2 s, ~7 in
    // ~1.05 s after the first, ≈ 6.7 tok/s each; the label answers (Tier-0, nothing escalates) have none.
    let (labels, generated) = (
        channel("tier0")["count"].clone(),
        channel("escalated")["count"].clone(),
    );
    assert!(
        labels.as_u64().unwrap() > 0 && generated.as_u64().unwrap() > 0,
        "{r}"
    );
    let d = &served["decode"];
    assert_eq!(d["streams"], generated, "{served}");
    let p50 = d["p50"].as_f64().unwrap();
    assert!((3.0..12.0).contains(&p50), "{d}");
    let line = |name: &str| {
        r["slo"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {}", r["slo"]))
            .clone()
    };
    let decode = line("chat: decode ≥ 60 tok/s a stream");
    assert_eq!(decode["measured"].as_f64(), Some(p50));
    assert_eq!(decode["pass"], false, "{decode}");
    let aggregate = line("batch: aggregate ≥ 120 tok/s");
    assert_eq!(
        aggregate["pass"], true,
        "reported, never failing: {aggregate}"
    );
    assert!(text.contains("decode per generating stream"), "{text}");
    assert!(text.contains("below (reported)"), "{text}");
    assert_eq!(r["gave_up"]["count"], 0, "{r}");

    // A 0.7 s timeout: every generation is given up on after a few tokens, each named with them.
    let (text, r) = run(&generations, "0.7s", "cut.json");
    let g = &r["gave_up"];
    assert_eq!(g["count"], 8, "{r}");
    for t in g["named"].as_array().unwrap() {
        assert_eq!(t["sent"], "one two three four five six seven", "{t}");
        assert_eq!(t["status"], 200, "{t}");
        assert_eq!(t["tier"], "llm", "{t}");
        let received = t["received"].as_str().unwrap();
        assert!(received.starts_with("stub: one"), "{t}");
        assert!(!received.contains("seven"), "cut before the end: {t}");
        assert!(t["events"].as_u64().unwrap() >= 2, "{t}");
    }
    assert!(
        text.contains("given up on at the 0.7 s timeout: 8"),
        "{text}"
    );
}

/// The Messages door on the default engine (`auto`: llama.cpp, SmolLM2): an answer cut by one of the client's
/// `stop_sequences` says so (`stop_reason: stop_sequence` and the one matched, JSON and stream alike), and
/// `count_tokens` gives the answer's own `input_tokens` without generating (the engine only tokenises).
#[test]
fn the_messages_door_names_the_stop_sequence_and_counts_the_prompt() {
    let s = start(&[]);
    let messages = |extra: Value| -> Value {
        let mut body = json!({"model": "generate", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ureq::post(&format!("{}/v1/messages", s.base))
            .set("anthropic-version", "2023-06-01")
            .send_json(body)
            .unwrap()
            .into_json()
            .unwrap()
    };
    let full = messages(json!({}));
    let text = full["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(full["stop_sequence"], Value::Null, "{full}");
    let word = text
        .split_whitespace()
        .nth(2)
        .expect("three words")
        .to_string();
    let cut = messages(json!({"stop_sequences": ["zzz-never", word]}));
    assert_eq!(cut["stop_reason"], "stop_sequence", "{cut}");
    assert_eq!(cut["stop_sequence"], word.as_str(), "{cut}");
    assert!(
        !cut["content"][0]["text"].as_str().unwrap().contains(&word),
        "{cut}"
    );
    // Streamed: the message_delta names it.
    let raw = ureq::post(&format!("{}/v1/messages", s.base))
        .set("anthropic-version", "2023-06-01")
        .send_json(
            json!({"model": "generate", "max_tokens": 24, "temperature": 0, "stream": true,
            "stop_sequences": [word],
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
        )
        .unwrap()
        .into_string()
        .unwrap();
    let delta: Value = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|v| v["type"] == "message_delta")
        .expect(&raw);
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(delta["delta"]["stop_sequence"], word.as_str(), "{delta}");
    // count_tokens: exactly the prompt the answer read.
    let counted: Value = ureq::post(&format!("{}/v1/messages/count_tokens", s.base))
        .set("anthropic-version", "2023-06-01")
        .send_json(json!({"model": "generate",
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(
        counted["input_tokens"], full["usage"]["input_tokens"],
        "{counted} / {full}"
    );
}
