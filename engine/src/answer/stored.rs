//! Stored responses (`[responses] store = true`): what a Responses door answered — the conversation that led
//! to it, its output, the response object — kept for `ttl_s` under its id and its tenant, so that
//! `previous_response_id` continues it and `GET /v1/responses/{id}` shows it. Another tenant's id reads as
//! absent. In Redis under the policy store's key when the policy store is Redis (any replica finds it, with
//! the TTL as its expiry), else in the local store the binary hands over (SQLite, `tiergate_feedback`), else in
//! memory. Every backend keeps at most `max_per_tenant` per tenant (its own oldest go first) and memory and
//! SQLite at most `max_entries` in all (the oldest of the tenant holding the most go first): one tenant filling
//! its share evicts no other's. The Redis calls go through the `responses_store` dependency ([`crate::deps`]):
//! each within five times `policy_store.timeout_ms`, none while its breaker is open. Synchronous: the door
//! calls it off the async runtime.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::deps::Dependency;

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
/// used when the policy store is not Redis; a Redis store's dependency joins `deps`.
pub(crate) fn open(
    config: &tiergate_config::Config,
    local: Option<Arc<dyn ResponseStore>>,
    deps: &crate::deps::Registry,
) -> anyhow::Result<Option<Arc<dyn ResponseStore>>> {
    let r = &config.responses;
    if !r.store {
        return Ok(None);
    }
    let store: Arc<dyn ResponseStore> = match (config.policy_store.kind, local) {
        (tiergate_config::StoreKind::Redis, _) => {
            let dep = Dependency::new(
                "responses_store",
                Duration::from_millis(config.policy_store.timeout_ms) * 5,
            );
            deps.add(&dep);
            Arc::new(RedisResponses {
                client: redis::Client::open(config.policy_store.url.as_str())?,
                idle: Mutex::new(Vec::new()),
                dep,
                prefix: format!("{}:responses:", config.policy_store.key),
                ttl_s: r.ttl_s,
                per_tenant: r.max_per_tenant,
            })
        }
        (tiergate_config::StoreKind::Memory, Some(local)) => local,
        (tiergate_config::StoreKind::Memory, None) => Arc::new(MemoryResponses::new(
            r.ttl_s.saturating_mul(1000),
            r.max_entries,
            r.max_per_tenant,
        )),
    };
    Ok(Some(store))
}

/// In this process, bounded per tenant and in all.
pub(crate) struct MemoryResponses {
    ttl_ms: u64,
    max: usize,
    per_tenant: usize,
    held: Mutex<Held>,
}

/// The responses and, per tenant, their ids oldest first.
#[derive(Default)]
struct Held {
    map: HashMap<String, StoredResponse>,
    order: HashMap<String, VecDeque<String>>,
}

impl Held {
    /// Drops `tenant`'s oldest response.
    fn drop_oldest(&mut self, tenant: &str) {
        let Some(ids) = self.order.get_mut(tenant) else {
            return;
        };
        if let Some(old) = ids.pop_front() {
            self.map.remove(&old);
        }
        if ids.is_empty() {
            self.order.remove(tenant);
        }
    }
}

impl MemoryResponses {
    pub(crate) fn new(ttl_ms: u64, max: usize, per_tenant: usize) -> Self {
        Self {
            ttl_ms,
            max,
            per_tenant,
            held: Mutex::new(Held::default()),
        }
    }
}

impl ResponseStore for MemoryResponses {
    fn put(&self, r: &StoredResponse) -> Result<(), String> {
        let mut h = self.held.lock().map_err(|e| e.to_string())?;
        if h.map.insert(r.id.clone(), r.clone()).is_none() {
            h.order
                .entry(r.tenant.clone())
                .or_default()
                .push_back(r.id.clone());
        }
        while h.order.get(&r.tenant).map_or(0, VecDeque::len) > self.per_tenant {
            h.drop_oldest(&r.tenant);
        }
        while h.map.len() > self.max {
            let Some(largest) = h
                .order
                .iter()
                .max_by_key(|(t, ids)| (ids.len(), **t == r.tenant))
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            h.drop_oldest(&largest);
        }
        Ok(())
    }

    fn get(&self, id: &str, tenant: &str) -> Result<Option<StoredResponse>, String> {
        let now = crate::evidence::ledger::now_ms();
        let h = self.held.lock().map_err(|e| e.to_string())?;
        Ok(h.map
            .get(id)
            .filter(|r| r.tenant == tenant && r.at_ms + self.ttl_ms > now)
            .cloned())
    }
}

/// In Redis, one key per response with the TTL as its expiry, and per tenant a sorted set of its ids by time
/// (trimmed to `per_tenant`, the trimmed responses deleted, in one script). Idle connections are taken, not
/// locked, while Redis is waited for.
pub(crate) struct RedisResponses {
    client: redis::Client,
    idle: Mutex<Vec<redis::Connection>>,
    dep: Arc<Dependency>,
    prefix: String,
    ttl_s: u64,
    per_tenant: usize,
}

/// Stores `ARGV[1]` under `KEYS[1]` for `ARGV[2]` seconds and adds its id `ARGV[4]` at `ARGV[3]` ms to the
/// tenant's set `KEYS[2]`; drops the set's expired ids and its oldest past `ARGV[5]`, with their responses
/// (`ARGV[6]` is the responses' key prefix).
const PUT: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[3]) - 1000 * tonumber(ARGV[2]))
local n = redis.call('ZCARD', KEYS[2])
local over = n - tonumber(ARGV[5])
if over > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for _, id in ipairs(old) do redis.call('DEL', ARGV[6] .. id) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
return n";

impl RedisResponses {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, String> {
        self.dep
            .blocking(|| {
                let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let mut conn = match idle {
                    Some(c) => c,
                    None => crate::deps::blocking_connection(&self.client, self.dep.deadline())?,
                };
                let r = f(&mut conn);
                if r.is_ok() {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if idle.len() < 8 {
                        idle.push(conn);
                    }
                }
                r
            })
            .map_err(|e| format!("redis: {e}"))
    }
}

impl ResponseStore for RedisResponses {
    fn put(&self, r: &StoredResponse) -> Result<(), String> {
        let body = serde_json::to_string(r).map_err(|e| e.to_string())?;
        self.with(|c| {
            redis::Script::new(PUT)
                .key(format!("{}{}", self.prefix, r.id))
                .key(format!("{}tenant:{}", self.prefix, r.tenant))
                .arg(&body)
                .arg(self.ttl_s)
                .arg(r.at_ms)
                .arg(&r.id)
                .arg(self.per_tenant)
                .arg(&self.prefix)
                .invoke::<u64>(c)
                .map(|_| ())
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
        let m = MemoryResponses::new(60_000, 2, 2);
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

    #[test]
    fn one_tenant_filling_its_share_evicts_none_of_anothers() {
        let now = crate::evidence::ledger::now_ms();
        let m = MemoryResponses::new(60_000, 6, 3);
        m.put(&stored("b0", "b", now)).unwrap();
        m.put(&stored("b1", "b", now)).unwrap();
        for i in 0..100 {
            m.put(&stored(&format!("a{i}"), "a", now)).unwrap();
        }
        assert!(m.get("b0", "b").unwrap().is_some());
        assert!(m.get("b1", "b").unwrap().is_some());
        assert!(m.get("a99", "a").unwrap().is_some());
        assert!(m.get("a96", "a").unwrap().is_none(), "a's own oldest went");
        // Past the total, the tenant holding the most gives way: c's first two evict a's, not b's.
        m.put(&stored("c0", "c", now)).unwrap();
        m.put(&stored("c1", "c", now)).unwrap();
        assert!(m.get("b0", "b").unwrap().is_some());
        assert!(m.get("a97", "a").unwrap().is_none());
        assert_eq!(m.held.lock().unwrap().map.len(), 6);
    }

    #[test]
    fn redis_keeps_each_tenants_share() {
        let port = crate::testing::free_port();
        let mut server = crate::testing::redis_server(port);
        let now = crate::evidence::ledger::now_ms();
        let r = RedisResponses {
            client: redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap(),
            idle: Mutex::new(Vec::new()),
            dep: Dependency::new("responses_store", Duration::from_secs(1)),
            prefix: "t:responses:".into(),
            ttl_s: 60,
            per_tenant: 3,
        };
        r.put(&stored("b0", "b", now)).unwrap();
        for i in 0..10 {
            r.put(&stored(&format!("a{i}"), "a", now + i)).unwrap();
        }
        assert!(r.get("b0", "b").unwrap().is_some());
        assert!(r.get("a9", "a").unwrap().is_some());
        assert!(r.get("a6", "a").unwrap().is_none(), "a's own oldest went");
        assert!(r.get("a9", "b").unwrap().is_none(), "another tenant's");
        let _ = server.kill();
        let _ = server.wait();
    }
}
