//! Stored responses (`[responses] store = true`): what a Responses door answered — the conversation that led
//! to it, its output, the response object — kept for `ttl_s` under its id and its tenant, so that
//! `previous_response_id` continues it and `GET /v1/responses/{id}` shows it. Another tenant's id reads as
//! absent. In Redis under the policy store's key when the policy store is Redis (any replica finds it, with
//! the TTL as its expiry), else in the local store the binary hands over (SQLite, `tiergate_feedback`), else in
//! memory (bounded by `max_entries`, oldest first). Synchronous: the door calls it off the async runtime.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One stored response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub id: String,
    pub tenant: String,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The conversation as Chat Completions messages (`role`, `content`, an assistant's `tool_calls`, a tool
    /// result's `tool_call_id`), its answer last: what `previous_response_id` continues.
    pub messages: Vec<serde_json::Value>,
    /// The response object as the door rendered it.
    pub response: serde_json::Value,
    /// The session its chain belongs to (the client's key, else the chain's first response id): a
    /// `previous_response_id` continuing it is that session's next turn.
    #[serde(default)]
    pub session: Option<String>,
}

/// Where stored responses live.
pub trait ResponseStore: Send + Sync {
    fn put(&self, r: &StoredResponse) -> Result<(), String>;
    /// `id` when `tenant` stored it and it has not expired.
    fn get(&self, id: &str, tenant: &str) -> Result<Option<StoredResponse>, String>;
}

/// The store `config` asks for; none when `[responses] store` is off. `local` is the binary's durable store,
/// used when the policy store is not Redis.
pub fn open(
    config: &tiergate_config::Config,
    local: Option<Arc<dyn ResponseStore>>,
) -> anyhow::Result<Option<Arc<dyn ResponseStore>>> {
    let r = &config.responses;
    if !r.store {
        return Ok(None);
    }
    let store: Arc<dyn ResponseStore> = match (config.policy_store.kind, local) {
        (tiergate_config::StoreKind::Redis, _) => Arc::new(RedisResponses {
            client: redis::Client::open(config.policy_store.url.as_str())?,
            conn: Mutex::new(None),
            prefix: format!("{}:responses:", config.policy_store.key),
            ttl_s: r.ttl_s,
        }),
        (tiergate_config::StoreKind::Memory, Some(local)) => local,
        (tiergate_config::StoreKind::Memory, None) => Arc::new(MemoryResponses {
            ttl_ms: r.ttl_s.saturating_mul(1000),
            max: r.max_entries,
            held: Mutex::new((HashMap::new(), VecDeque::new())),
        }),
    };
    Ok(Some(store))
}

/// In this process, bounded.
pub(crate) struct MemoryResponses {
    ttl_ms: u64,
    max: usize,
    held: Mutex<(HashMap<String, StoredResponse>, VecDeque<String>)>,
}

impl ResponseStore for MemoryResponses {
    fn put(&self, r: &StoredResponse) -> Result<(), String> {
        let mut g = self.held.lock().map_err(|e| e.to_string())?;
        let (map, order) = &mut *g;
        if map.insert(r.id.clone(), r.clone()).is_none() {
            order.push_back(r.id.clone());
        }
        while order.len() > self.max {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        Ok(())
    }

    fn get(&self, id: &str, tenant: &str) -> Result<Option<StoredResponse>, String> {
        let now = crate::evidence::ledger::now_ms();
        let g = self.held.lock().map_err(|e| e.to_string())?;
        Ok(g.0
            .get(id)
            .filter(|r| r.tenant == tenant && r.at_ms + self.ttl_ms > now)
            .cloned())
    }
}

/// In Redis, one key per response with the TTL as its expiry, over one kept connection (made again after a
/// failure).
pub(crate) struct RedisResponses {
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    prefix: String,
    ttl_s: u64,
}

impl RedisResponses {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, String> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(std::time::Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
            *guard = Some(c);
        }
        let Some(conn) = guard.as_mut() else {
            return Err("redis: no connection".into());
        };
        let r = f(conn);
        if r.is_err() {
            *guard = None;
        }
        r.map_err(|e| e.to_string())
    }
}

impl ResponseStore for RedisResponses {
    fn put(&self, r: &StoredResponse) -> Result<(), String> {
        let body = serde_json::to_string(r).map_err(|e| e.to_string())?;
        self.with(|c| {
            redis::cmd("SET")
                .arg(format!("{}{}", self.prefix, r.id))
                .arg(&body)
                .arg("EX")
                .arg(self.ttl_s)
                .query::<()>(c)
        })
    }

    fn get(&self, id: &str, tenant: &str) -> Result<Option<StoredResponse>, String> {
        let raw: Option<String> = self.with(|c| {
            redis::cmd("GET")
                .arg(format!("{}{id}", self.prefix))
                .query(c)
        })?;
        Ok(raw
            .and_then(|s| serde_json::from_str::<StoredResponse>(&s).ok())
            .filter(|r| r.tenant == tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: &str, tenant: &str, at_ms: u64) -> StoredResponse {
        StoredResponse {
            id: id.into(),
            tenant: tenant.into(),
            at_ms,
            messages: vec![serde_json::json!({"role": "user", "content": "hi"})],
            response: serde_json::json!({"id": id}),
            session: None,
        }
    }

    #[test]
    fn memory_keeps_its_bound_its_ttl_and_its_tenants_apart() {
        let now = crate::evidence::ledger::now_ms();
        let m = MemoryResponses {
            ttl_ms: 60_000,
            max: 2,
            held: Mutex::new((HashMap::new(), VecDeque::new())),
        };
        for i in 0..3 {
            m.put(&stored(&format!("r{i}"), "a", now)).unwrap();
        }
        assert!(m.get("r0", "a").unwrap().is_none(), "the oldest went first");
        assert!(m.get("r2", "a").unwrap().is_some());
        assert!(
            m.get("r2", "b").unwrap().is_none(),
            "another tenant's is absent"
        );
        m.put(&stored("old", "a", now - 120_000)).unwrap();
        assert!(m.get("old", "a").unwrap().is_none(), "expired");
    }
}
