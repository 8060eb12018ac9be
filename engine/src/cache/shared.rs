//! The exact store shared by replicas on Redis (`[cache] kind = "redis"`): one key per verdict under the
//! namespace, the TTL as its expiry. Every exchange is bounded by `redis_timeout_ms`; after a failure the
//! store is skipped for a second, so a Redis that is gone costs lookups nothing but a miss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tiergate_config::CacheConfig;
use tiergate_core::fnv::Fnv;

/// How long a failed store is skipped.
const BACKOFF: Duration = Duration::from_secs(1);

/// The shared exact store.
pub struct Shared {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    namespace: String,
    timeout: Duration,
    ttl_s: u64,
    skip_until: Mutex<Option<Instant>>,
    up: AtomicBool,
}

impl Shared {
    /// A store for `cfg` (no connection is made yet).
    pub fn new(cfg: &CacheConfig) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(cfg.url.as_str())?,
            conn: tokio::sync::Mutex::new(None),
            namespace: cfg.namespace.clone(),
            timeout: Duration::from_millis(cfg.redis_timeout_ms),
            ttl_s: cfg.ttl_s,
            skip_until: Mutex::new(None),
            up: AtomicBool::new(true),
        })
    }

    /// Whether the last exchange worked.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    fn redis_key(&self, key: &str) -> String {
        format!(
            "{}:{:016x}",
            self.namespace,
            Fnv::new().eat(key.as_bytes()).finish()
        )
    }

    /// The verdict stored under `key`, when Redis answers in time and holds this key's (not another's with the
    /// same hash).
    pub async fn get<V: serde::de::DeserializeOwned + HasKey>(&self, key: &str) -> Option<V> {
        let k = self.redis_key(key);
        let raw: Option<String> = self
            .exchange(|mut c| async move { c.get(k).await })
            .await
            .flatten();
        let v: V = serde_json::from_str(&raw?).ok()?;
        (v.key() == key).then_some(v)
    }

    /// Stores `v` under `key` with the TTL (a failure is logged and counted, never returned).
    pub async fn set<V: serde::Serialize>(&self, key: &str, v: &V) {
        let (k, ttl) = (self.redis_key(key), self.ttl_s);
        let Ok(body) = serde_json::to_string(v) else {
            return;
        };
        let _: Option<()> = self
            .exchange(|mut c| async move { c.set_ex(k, body, ttl).await })
            .await;
    }

    /// Deletes every key of the namespace; how many (`None`: Redis did not answer).
    pub async fn clear(&self) -> Option<usize> {
        let pattern = format!("{}:*", self.namespace);
        // Clearing may take longer than a lookup: ten times the budget.
        let budget = self.timeout * 10;
        let c = self.connection().await.ok()?;
        let r = tokio::time::timeout(budget, async move {
            let mut c = c;
            let keys: Vec<String> = {
                let mut it: redis::AsyncIter<String> = c.scan_match(&pattern).await?;
                let mut keys = Vec::new();
                while let Some(k) = it.next_item().await {
                    keys.push(k);
                }
                keys
            };
            let mut n = 0usize;
            for chunk in keys.chunks(500) {
                let d: usize = c.del(chunk).await?;
                n += d;
            }
            Ok::<usize, redis::RedisError>(n)
        })
        .await;
        let out = match r {
            Ok(Ok(n)) => Some(n),
            _ => None,
        };
        self.note(out.is_some()).await;
        out
    }

    /// Runs `f` on a connection within the timeout; `None` when Redis is skipped, late or failing.
    async fn exchange<T, F, Fut>(&self, f: F) -> Option<T>
    where
        F: FnOnce(redis::aio::MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if self
            .skip_until
            .lock()
            .ok()
            .and_then(|s| *s)
            .is_some_and(|t| Instant::now() < t)
        {
            return None;
        }
        let r = tokio::time::timeout(self.timeout, async {
            let c = self.connection().await?;
            f(c).await
        })
        .await;
        let out = match r {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "shared answer cache failed: a miss");
                None
            }
            Err(_) => None,
        };
        self.note(out.is_some()).await;
        out
    }

    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let c = self.client.get_multiplexed_async_connection().await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    async fn note(&self, ok: bool) {
        if self.up.swap(ok, Ordering::AcqRel) != ok {
            if ok {
                tracing::info!(namespace = %self.namespace, "shared answer cache reachable");
            } else {
                tracing::warn!(namespace = %self.namespace, "shared answer cache unreachable: lookups miss it");
            }
        }
        if !ok {
            *self.conn.lock().await = None;
            if let Ok(mut s) = self.skip_until.lock() {
                *s = Some(Instant::now() + BACKOFF);
            }
        }
        metrics::gauge!(crate::metrics::CACHE_SHARED_UP).set(if ok { 1.0 } else { 0.0 });
    }
}

/// A stored value that names its full key.
pub trait HasKey {
    fn key(&self) -> &str;
}
