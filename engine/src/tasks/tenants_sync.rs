//! Tenants' limits across replicas (`[policy_store] kind = "redis"`). Each replica keeps its own token buckets
//! (request rate, LLM budget), so a request never waits on Redis. Every `sync_ms` a replica adds what it used
//! since the last exchange to one shared counter per tenant and limit (`INCRBYFLOAT`, atomic in Redis), reads
//! the total back, and takes what the other replicas used meanwhile from its own buckets. So all replicas
//! together admit about one tenant's rate: in steady state each bucket refills at the rate and pays for every
//! replica's use. The tolerance: between two exchanges each of N replicas may admit its own bucket's content
//! plus one period's refill before it sees the others' use, so a burst across replicas can exceed the limit
//! by at most about `(N − 1) × (burst + rate × sync_ms)`. With Redis unreachable each replica enforces its
//! limits alone (N times the rate at most), says so in `tiergate_tenant_limits_shared` (0), and starts
//! counting afresh when Redis is back (the others' use while it was gone is not charged twice).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::routing::store::RedisStore;
use crate::state::AppState;
use crate::tenancy::tenants::Shared;

/// One shared counter: its Redis key and this replica's bucket.
struct Counter {
    key: String,
    limit: Arc<Mutex<dyn Shared + Send>>,
}

/// The counters of the tenants in force.
fn counters(state: &AppState, prefix: &str) -> Vec<Counter> {
    let tenants = state.tenants();
    let mut out = Vec::new();
    for t in tenants.all() {
        if let Some(b) = t.bucket() {
            out.push(Counter {
                key: format!("{prefix}:tenant:{}:requests", t.id.0),
                limit: b.clone(),
            });
        }
        if let Some(b) = t.budget() {
            out.push(Counter {
                key: format!("{prefix}:tenant:{}:llm_seconds", t.id.0),
                limit: b.clone(),
            });
        }
    }
    out
}

/// What one exchange does with the totals: `seen` holds each counter's total after this replica's last
/// exchange; returns the others' use since then (none at a counter's first exchange).
pub(crate) fn others_use(seen: &mut HashMap<String, f64>, key: &str, mine: f64, total: f64) -> f64 {
    let others = seen.get(key).map_or(0.0, |last| total - last - mine);
    seen.insert(key.to_string(), total);
    others.max(0.0)
}

/// Keeps this replica's tenant limits in step with the other replicas' until the state is dropped.
pub(crate) async fn sync_tenants(store: Arc<RedisStore>, state: Weak<AppState>) {
    let mut seen: HashMap<String, f64> = HashMap::new();
    loop {
        let Some(s) = state.upgrade() else {
            return;
        };
        let counters = counters(&s, store.key());
        drop(s);
        if !counters.is_empty() {
            let deltas: Vec<(String, f64)> = counters
                .iter()
                .map(|c| {
                    let mine = c.limit.lock().map_or(0.0, |mut l| l.take_unsynced());
                    (c.key.clone(), mine)
                })
                .collect();
            match store.add_counters(&deltas).await {
                Ok(totals) => {
                    for ((c, (key, mine)), total) in counters.iter().zip(&deltas).zip(totals) {
                        let others = others_use(&mut seen, key, *mine, total);
                        if let Ok(mut l) = c.limit.lock() {
                            l.absorb(others);
                        }
                    }
                    metrics::gauge!(crate::metrics::TENANT_LIMITS_SHARED).set(1.0);
                }
                Err(e) => {
                    if !seen.is_empty() {
                        tracing::warn!(error = %e, "tenant limits: Redis unreachable, each replica enforces them alone");
                    }
                    // Counted afresh when Redis is back.
                    seen.clear();
                    metrics::gauge!(crate::metrics::TENANT_LIMITS_SHARED).set(0.0);
                }
            }
        }
        tokio::time::sleep(store.period()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_others_use_is_the_total_less_what_this_replica_saw_and_added() {
        let mut seen = HashMap::new();
        // First exchange: a baseline, whatever was counted before this replica started.
        assert_eq!(others_use(&mut seen, "k", 3.0, 103.0), 0.0);
        // Then: the total moved by 10, 4 of them ours.
        assert_eq!(others_use(&mut seen, "k", 4.0, 113.0), 6.0);
        // Nobody else: nothing to absorb.
        assert_eq!(others_use(&mut seen, "k", 2.0, 115.0), 0.0);
        // A reset counter (Redis restarted empty) is no negative use.
        assert_eq!(others_use(&mut seen, "k", 1.0, 1.0), 0.0);
        assert_eq!(others_use(&mut seen, "k", 1.0, 5.0), 3.0);
    }
}
