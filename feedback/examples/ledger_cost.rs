//! What a decision record costs the request path, and how fast the writer keeps up: N records built as the
//! chat handler builds them and handed to the ledger (`Ledger::record`: a `try_send` into the bounded
//! channel), against building them alone (the peer in the same run), then the time until the SQLite writer has
//! stored them all.
//!
//! usage: cargo run --example ledger_cost -p tiergate-feedback [N]   (default 100000)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use tiergate_engine::evidence::ledger::{now_ms, Entry, Ledger, Record, Store};
use tiergate_feedback::sqlite::SqliteStore;

fn record(i: usize, at: u64) -> Record {
    Record {
        id: format!("chatcmpl-{i:016x}"),
        alias: None,
        at_ms: at,
        tenant: "acme".into(),
        route: "classify".into(),
        channel: "tier0".into(),
        tier: "tier0".into(),
        degraded: None,
        stage: None,
        label: Some("card_arrival".into()),
        ambiguity: Some(0.12),
        top: (0..5)
            .map(|k| (format!("label_{k}"), 0.9 / (k + 1) as f32))
            .collect(),
        theta: Some(0.77),
        policy_version: 3,
        head: "0123456789abcdef".into(),
        text: None,
        forced: false,
        session: None,
        switch: None,
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("f.sqlite"), 1 << 30, 3600).unwrap());
    let ledger = Ledger::start(store.clone(), n, 3600);
    let at = now_ms();
    for round in 0..3 {
        let t = Instant::now();
        let mut sink = 0usize;
        for i in 0..n {
            sink += record(i, at).top.len();
        }
        let build_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in 0..n {
            ledger.record(Entry::Decision(Box::new(record(round * n + i, at))));
        }
        let send_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        let last = format!("chatcmpl-{:016x}", round * n + n - 1);
        while store.decision(&last, now_ms()).unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let drain_s = t.elapsed().as_secs_f64();
        println!(
            "round {round}: build {build_ns:.0} ns/record (peer), build + record() {send_ns:.0} ns/record \
             (+{:.0} ns on the request path), writer drained {n} in {drain_s:.2} s after the last send ({sink})",
            send_ns - build_ns
        );
    }
}
