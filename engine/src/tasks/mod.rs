//! The engine's background tasks, started once the state is built.

pub(crate) mod fleet;
pub(crate) mod head_swap;
pub(crate) mod second_opinion;
pub(crate) mod tenants_sync;
pub(crate) mod utilization;

use std::sync::Arc;

use crate::state::AppState;

/// Starts the engine's background tasks: utilisation sampling, the audit follower, the LLM's second opinion,
/// the shared store's syncs (the policy, each route's and stage's policy, heads, tenants) and the fleet's Prometheus poll.
/// Each holds a weak reference and ends when the state is gone.
pub(crate) fn start(state: &Arc<AppState>) {
    tokio::spawn(crate::tasks::utilization::sample_utilization(
        Arc::downgrade(state),
    ));
    tokio::spawn(follow_audits(Arc::downgrade(state)));
    tokio::spawn(crate::tasks::second_opinion::run(Arc::downgrade(state)));
    if let Some(store) = &state.routing.store {
        tokio::spawn(crate::routing::store::sync_policy(
            store.clone(),
            store.routing_key().to_string(),
            Arc::downgrade(&state.routing.policy),
        ));
        for rp in state.route_policies() {
            tokio::spawn(crate::routing::store::sync_policy(
                store.clone(),
                store.policy_key(&rp.route, rp.stage.as_deref()),
                Arc::downgrade(&rp.policy),
            ));
        }
        tokio::spawn(crate::tasks::head_swap::sync_heads(
            store.clone(),
            Arc::downgrade(state),
        ));
        tokio::spawn(crate::tasks::tenants_sync::sync_tenants(
            store.clone(),
            Arc::downgrade(state),
        ));
    }
    if state
        .cache
        .as_ref()
        .is_some_and(|c| c.shared_up().is_some())
    {
        tokio::spawn(follow_cache_clears(Arc::downgrade(state)));
    }
    if !state.config.utilization.prometheus_url.is_empty() {
        tokio::spawn(crate::tasks::fleet::poll_prometheus(
            Arc::downgrade(state),
            state.config.utilization.clone(),
        ));
    }
}

/// How often each route's labelled audits are read again from the ledger.
const AUDITS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps each classified route's audits (labelled within the feedback window) in step with the ledger, so
/// that the bound follows what the labels say of the live traffic (on any replica, with the Redis ledger).
/// Nothing is read while the policy sets no bound: the bound is what the rows are for.
async fn follow_audits(state: std::sync::Weak<crate::state::AppState>) {
    loop {
        tokio::time::sleep(AUDITS_EVERY).await;
        let Some(s) = state.upgrade() else { return };
        let Some(ledger) = s.evidence.ledger.clone() else {
            return;
        };
        if s.routing.policy.current().cfg.max_error.is_none() {
            continue;
        }
        let since = crate::evidence::ledger::now_ms().saturating_sub(ledger.window_ms());
        // Evidence belongs to the head that answered: each route's head in force.
        let routes: Vec<(String, String)> = s
            .routing
            .routes
            .iter()
            .filter(|(_, r)| r.prefilter.is_some())
            .map(|(n, r)| (n.clone(), r.head_version.clone()))
            .collect();
        drop(s);
        for (name, head) in routes {
            let store = ledger.store();
            let (route, of) = (name.clone(), head.clone());
            let read = tokio::task::spawn_blocking(move || {
                Ok::<_, crate::evidence::ledger::StoreError>((
                    store.labelled(&route, &of, since)?,
                    store.trusted_feedback(&route, &of, since)?,
                ))
            })
            .await;
            let Some(s) = state.upgrade() else { return };
            match read {
                Ok(Ok((audits, feedback))) => {
                    // A head swapped in meanwhile starts with its own (none yet).
                    if let Some(r) = s
                        .routing
                        .routes
                        .get(&name)
                        .filter(|r| r.head_version == head)
                    {
                        r.risk.set_audits(audits);
                        r.risk.set_feedback(feedback);
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, route = %name, "labelled audits not read")
                }
                Err(e) => tracing::debug!(error = %e, "labelled audits not read"),
            }
        }
    }
}

/// Every [`crate::cache::FOLLOW_EVERY`]: drops this replica's answer-cache entries once a clear through any
/// replica moved the shared epoch on, so that a cleared (possibly poisoned) verdict is served nowhere.
async fn follow_cache_clears(state: std::sync::Weak<AppState>) {
    loop {
        tokio::time::sleep(crate::cache::FOLLOW_EVERY).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        if let Some(c) = &state.cache {
            c.follow_shared_clears().await;
        }
    }
}
