//! Two real `tiergate serve` replicas sharing the answer cache's exact store through a real `redis-server`
//! (started by the test on a free loopback port), with stub LLM workers: a verdict computed on one is an
//! exact hit on the other; `DELETE /admin/cache` clears the shared namespace and every replica's own store;
//! with Redis killed both keep
//! answering (the shared store is a miss, never an error).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{free_port, redis, start};

/// The verdict keys of the namespace (its epoch key aside).
fn keys(port: u16) -> usize {
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "--scan",
            "--pattern",
            "tiergate:cache:*",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|k| *k != "tiergate:cache:epoch")
        .count()
}

/// One classify request: status, `x-tiergate-tier`, `x-tiergate-cache`, the label.
fn ask(base: &str, text: &str) -> (u16, String, String, String) {
    let r = ureq::post(&format!("{base}/v1/chat/completions"))
        .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": text}]}))
        .unwrap();
    let h = |k: &str| r.header(k).unwrap_or("").to_string();
    let (status, tier, cache) = (r.status(), h("x-tiergate-tier"), h("x-tiergate-cache"));
    let v: Value = r.into_json().unwrap();
    let label = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    (status, tier, cache, label)
}

#[test]
fn a_verdict_computed_on_one_replica_is_an_exact_hit_on_the_other() {
    let port = free_port();
    let mut redis_proc = redis(port);
    let url = format!("cache.url=\"redis://127.0.0.1:{port}/0\"");
    let args = [
        "--set",
        "cache.enabled=true",
        "--set",
        "cache.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.workers=1",
        // Every classify request escalates.
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
    ];
    let a = start(&args);
    let b = start(&args);
    let text = "my card never arrived in the post";
    let (s, tier, _, fresh) = ask(&a.base, text);
    assert_eq!((s, tier.as_str()), (200, "llm"));
    // The write to Redis is in the background: wait for the key.
    let t = Instant::now();
    while keys(port) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no key written");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (s, tier, cache, label) = ask(&b.base, text);
    assert_eq!((s, tier.as_str(), cache.as_str()), (200, "cache", "exact"));
    assert_eq!(label, fresh, "B answers with A's verdict");
    // Another question is not a hit on either.
    let (_, tier, _, _) = ask(&b.base, "how do i change my pin");
    assert_eq!(tier, "llm");
    // B writes that verdict in the background: wait for both keys before the clear counts them.
    let t = Instant::now();
    while keys(port) < 2 {
        assert!(t.elapsed() < Duration::from_secs(5), "B's key not written");
        std::thread::sleep(Duration::from_millis(20));
    }

    // DELETE on A clears A, the shared namespace and — within a follow period — B's own store: a cleared
    // (possibly poisoned) verdict is served by no replica.
    let r = ureq::delete(&format!("{}/admin/cache", a.admin))
        .call()
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "two keys are removed within the clear's budget"
    );
    let v: Value = r.into_json().unwrap();
    assert_eq!(v["shared"]["removal"]["state"], "done", "{v}");
    assert!(
        v["shared"]["removal"]["deleted"].as_u64().unwrap() >= 2,
        "{v}"
    );
    assert_eq!(v["shared"]["epoch"], 1, "{v}");
    assert_eq!(keys(port), 0);
    assert_eq!(v["cleared"], 1, "A's own entry: {v}");
    // B's own store (two entries) is dropped within a follow period, before anyone asks again.
    let t = Instant::now();
    loop {
        let info: Value = ureq::get(&format!("{}/admin/cache", b.admin))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        if info["entries"] == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "A's clear did not reach B's own store: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, tier, _, _) = ask(&b.base, text);
    assert_eq!(
        tier, "llm",
        "cleared on B too: the old verdict is served nowhere"
    );
    // B keeps that fresh verdict in its own store.
    let t = Instant::now();
    while ask(&b.base, text).1 != "cache" {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "B's fresh verdict not kept"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Redis gone: both answer; a question neither has seen goes to the LLM, one B holds is still a hit.
    redis_proc.kill();
    for base in [&a.base, &b.base] {
        let (s, tier, _, _) = ask(base, "what is the exchange rate for euros");
        assert_eq!((s, tier.as_str()), (200, "llm"));
    }
    let (s, tier, _, _) = ask(&b.base, text);
    assert_eq!((s, tier.as_str()), (200, "cache"));
    let info: Value = ureq::get(&format!("{}/admin/cache", b.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(info["shared_up"], false, "{info}");
}

/// Keys under the namespace made by Redis itself (a Lua loop), so that deleting them outlasts a clear's
/// budget.
fn fill(port: u16, n: usize) {
    let script = format!(
        "for i=1,{n} do redis.call('SET','tiergate:cache:filler:'..i,'x','EX',3600) end return {n}"
    );
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "EVAL", &script, "0"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), n.to_string());
}

/// A clear whose removal of old keys outlasts its budget (ten lookup budgets: 200 ms here, against 1,000,000
/// keys) answers 202 and finishes in the background, reported by `GET /admin/cache`; the clear is whole at
/// once all the same (the epoch moved on: an old verdict is read by no replica while its key still exists),
/// lookups go on meanwhile (the store is never marked down for it), and a verdict written after the clear
/// is a hit on the other replica.
#[test]
fn a_clear_that_outlasts_its_budget_finishes_in_the_background() {
    let port = free_port();
    let _redis = redis(port);
    let url = format!("cache.url=\"redis://127.0.0.1:{port}/0\"");
    let args = [
        "--set",
        "cache.enabled=true",
        "--set",
        "cache.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        // 20 ms a lookup or write (a first write loads its script: a few round trips), so the clear's
        // budget is 200 ms, which 1,000,000 keys outlast (200,000 were removed within it on a quiet 2-core machine).
        "cache.redis_timeout_ms=20",
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.workers=1",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
    ];
    let a = start(&args);
    let b = start(&args);
    let old = "my card never arrived in the post";
    assert_eq!(ask(&a.base, old).1, "llm");
    let t = Instant::now();
    while keys(port) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no key written");
        std::thread::sleep(Duration::from_millis(20));
    }
    fill(port, 1_000_000);
    let r = ureq::delete(&format!("{}/admin/cache", a.admin))
        .call()
        .unwrap();
    let status = r.status();
    let v: Value = r.into_json().unwrap();
    assert_eq!(status, 202, "{v}");
    assert_eq!(v["shared"]["removal"]["state"], "running", "{v}");
    // Whole at once: B (which never cleared) does not read the old verdict, though its key may still be there.
    assert_eq!(ask(&b.base, old).1, "llm");
    let info: Value = ureq::get(&format!("{}/admin/cache", a.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(info["shared_up"], true, "{info}");
    // A verdict computed after the clear is shared as before.
    let fresh = "how do i change my pin";
    assert_eq!(ask(&a.base, fresh).1, "llm");
    let t = Instant::now();
    loop {
        let (_, tier, cache, _) = ask(&b.base, fresh);
        if tier == "cache" {
            assert_eq!(cache, "exact");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no shared hit on B");
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    let removal = loop {
        let info: Value = ureq::get(&format!("{}/admin/cache", a.admin))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let r = info["shared_removal"].clone();
        if r["state"] != "running" {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{info}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(removal["state"], "done", "{removal}");
    assert!(
        removal["deleted"].as_u64().unwrap() >= 1_000_000,
        "{removal}"
    );
}
