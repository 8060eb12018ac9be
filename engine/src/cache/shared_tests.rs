//! The answer cache's shared store on a real `redis-server` (started by the test on a free loopback port):
//! a verdict computed before a clear is never written after it, on this replica or another.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use super::{AnswerCache, Verdict};

use crate::testing::free_port;

/// The verdict keys of the namespace (its epoch key aside).
fn keys(port: u16) -> usize {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
    let mut c = client.get_connection().unwrap();
    let all: Vec<String> = redis::cmd("KEYS")
        .arg("tiergate:cache:*")
        .query(&mut c)
        .unwrap();
    all.iter().filter(|k| *k != "tiergate:cache:epoch").count()
}

/// A verdict computed before a clear is not written after it: a probe made, another replica clears (the
/// shared epoch moves on), then the write comes — it lands in neither store.
#[test]
fn a_verdict_from_before_a_clear_is_not_written_after_it() {
    let port = free_port();
    let mut redis = crate::testing::redis_server(port);
    let mut cfg = tiergate_config::CacheConfig {
        enabled: true,
        kind: tiergate_config::CacheKind::Redis,
        url: format!("redis://127.0.0.1:{port}/0"),
        ..Default::default()
    };
    cfg.redis_timeout_ms = 500;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let here = AnswerCache::new(&cfg).unwrap().unwrap();
        let other = AnswerCache::new(&cfg).unwrap().unwrap();
        let verdict = |key: &str| Verdict {
            key: key.into(),
            candidates: vec![0, 1],
            scores: vec![0.9, 0.1],
            fused: vec![(0, 0.9)],
            backend: "llm".into(),
            at_ms: 0,
            text: None,
            finish_reason: String::new(),
            completion_tokens: 0,
        };
        // Written under the epoch it was asked under: found by the other replica.
        let p = here.exact_probe("k1".into());
        here.share("k1", p.shared_epoch(), &verdict("k1")).await;
        assert!(other
            .lookup(&other.exact_probe("k1".into()))
            .await
            .is_some());
        // Asked, then the other replica clears, then the write: not written, not found.
        let p = here.exact_probe("k2".into());
        let (_, cleared) = other.clear().await;
        assert!(cleared.unwrap().is_some(), "the clear reached Redis");
        here.share("k2", p.shared_epoch(), &verdict("k2")).await;
        here.put(&p, verdict("k2"));
        assert!(other
            .lookup(&other.exact_probe("k2".into()))
            .await
            .is_none());
        assert!(keys(port) == 0, "no verdict key after the clear");
        // This replica's own clear: a probe from before it is not kept here either.
        let p = here.exact_probe("k3".into());
        here.clear().await;
        here.put(&p, verdict("k3"));
        assert!(here.lookup(&here.exact_probe("k3".into())).await.is_none());
        // k1 from before the clear is read by neither.
        assert!(here.lookup(&here.exact_probe("k1".into())).await.is_none());
    });
    let _ = redis.kill();
    let _ = redis.wait();
}
