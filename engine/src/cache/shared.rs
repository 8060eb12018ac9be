//! The exact store shared by replicas on Redis (`[cache] kind = "redis"`): one key per verdict under the
//! namespace, the TTL as its expiry. Every exchange is bounded by `redis_timeout_ms`; after a failure the
//! store is skipped for a second, so a Redis that is gone costs lookups nothing but a miss.
//!
//! A clear is a generation: `{namespace}:epoch` is incremented (one command, so the clear is whole at once
//! for every replica), each verdict is stored with the epoch it was computed under and read only while that
//! epoch is current, and a write lands only if the epoch is still the one its lookup saw (a Lua
//! compare-and-set), so a verdict computed before a clear is never written after it. The old keys are then
//! deleted in the background ([`Removal`]), however long that takes; the clear never marks the store down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use redis::AsyncCommands;
use tiergate_config::CacheConfig;
use tiergate_core::fnv::Fnv;

/// How long a failed store is skipped.
const BACKOFF: Duration = Duration::from_secs(1);

/// The shared exact store.
pub(crate) struct Shared {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    namespace: String,
    timeout: Duration,
    ttl_s: u64,
    skip_until: Mutex<Option<Instant>>,
    up: AtomicBool,
    /// The newest epoch this replica has seen.
    known: AtomicU64,
    /// The last clear's removal of old keys.
    removal: Arc<Mutex<Removal>>,
}

/// How the removal of a clear's old keys went.
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq)]
pub(crate) struct Removal {
    /// `idle` (no clear yet), `running`, `done` or `failed`.
    pub state: &'static str,
    /// Keys deleted so far.
    pub deleted: usize,
    /// Why it stopped, when it failed (the keys left expire with their TTL and are never read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a clear of the shared store did.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Cleared {
    /// The epoch now current: every verdict stored before it is no longer read by any replica.
    pub epoch: u64,
    /// The removal of the old keys, as it stood when the clear answered.
    pub removal: Removal,
}

/// A verdict as stored: the epoch it was computed under, and the verdict.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored<V> {
    epoch: u64,
    v: V,
}

/// Writes `ARGV[2]` under `KEYS[1]` for `ARGV[3]` seconds only while the epoch `KEYS[2]` is `ARGV[1]`.
const WRITE_IF_EPOCH: &str = r"
local e = redis.call('GET', KEYS[2]) or '0'
if e == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0";

impl Shared {
    /// A store for `cfg` (no connection is made yet).
    pub(crate) fn new(cfg: &CacheConfig) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(cfg.url.as_str())?,
            conn: tokio::sync::Mutex::new(None),
            namespace: cfg.namespace.clone(),
            timeout: Duration::from_millis(cfg.redis_timeout_ms),
            ttl_s: cfg.ttl_s,
            skip_until: Mutex::new(None),
            up: AtomicBool::new(true),
            known: AtomicU64::new(0),
            removal: Arc::new(Mutex::new(Removal {
                state: "idle",
                ..Removal::default()
            })),
        })
    }

    /// The newest epoch this replica has seen: a lookup's write is conditional on it.
    pub(crate) fn known_epoch(&self) -> u64 {
        self.known.load(Ordering::Acquire)
    }

    /// Reads the shared epoch and returns the newest this replica knows. In the background, within ten lookup
    /// budgets, and apart from the lookups' health: a late read here marks nothing down (a clear's removal
    /// can keep Redis busy for a while).
    pub(crate) async fn follow_epoch(&self) -> u64 {
        let key = self.epoch_key();
        let read = tokio::time::timeout(self.timeout * 10, async {
            let mut c = self.connection().await?;
            c.get::<_, Option<u64>>(key).await
        })
        .await;
        if let Ok(Ok(Some(e))) = read {
            self.known.fetch_max(e, Ordering::AcqRel);
        }
        self.known_epoch()
    }

    /// The last clear's removal of old keys.
    pub(crate) fn removal(&self) -> Removal {
        self.removal.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn epoch_key(&self) -> String {
        format!("{}:epoch", self.namespace)
    }

    /// Whether the last exchange worked.
    pub(crate) fn is_up(&self) -> bool {
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
    /// same hash) from the current epoch. Reads the epoch in the same round trip.
    pub(crate) async fn get<V: serde::de::DeserializeOwned + HasKey>(
        &self,
        key: &str,
    ) -> Option<V> {
        let keys = [self.redis_key(key), self.epoch_key()];
        let (raw, epoch): (Option<String>, Option<u64>) = self
            .exchange(|mut c| async move { c.mget(&keys[..]).await })
            .await?;
        let epoch = epoch.unwrap_or(0);
        self.known.fetch_max(epoch, Ordering::AcqRel);
        let stored: Stored<V> = serde_json::from_str(&raw?).ok()?;
        (stored.epoch == epoch && stored.v.key() == key).then_some(stored.v)
    }

    /// Stores `v` under `key` with the TTL, only while `epoch` (the one its lookup saw) is current (a failure
    /// is logged and counted, never returned; a clear since is a skipped write).
    pub(crate) async fn set<V: serde::Serialize>(&self, key: &str, epoch: u64, v: &V) {
        let keys = (self.redis_key(key), self.epoch_key());
        let ttl = self.ttl_s;
        let Ok(body) = serde_json::to_string(&Stored { epoch, v }) else {
            return;
        };
        let written: Option<i64> = self
            .exchange(|mut c| async move {
                redis::Script::new(WRITE_IF_EPOCH)
                    .key(keys.0)
                    .key(keys.1)
                    .arg(epoch)
                    .arg(body)
                    .arg(ttl)
                    .invoke_async(&mut c)
                    .await
            })
            .await;
        if written == Some(0) {
            tracing::debug!("a verdict from before a clear was not written");
        }
    }

    /// Clears the store for every replica at once: the epoch moves on (`None`: Redis did not answer within ten
    /// lookup budgets, and nothing changed), then the old keys are deleted in the background; waits up to
    /// the same budget for that removal, and reports where it stands.
    pub(crate) async fn clear(&self) -> Option<Cleared> {
        let budget = self.timeout * 10;
        let key = self.epoch_key();
        let c = tokio::time::timeout(budget, self.connection())
            .await
            .ok()?
            .ok()?;
        let mut incr = c.clone();
        let epoch: u64 = tokio::time::timeout(budget, async move { incr.incr(key, 1u64).await })
            .await
            .ok()?
            .ok()?;
        self.known.fetch_max(epoch, Ordering::AcqRel);
        if let Ok(mut r) = self.removal.lock() {
            *r = Removal {
                state: "running",
                ..Removal::default()
            };
        }
        let task = tokio::spawn(remove_old(
            c,
            self.namespace.clone(),
            self.epoch_key(),
            self.removal.clone(),
            budget,
        ));
        let _ = tokio::time::timeout(budget, task).await;
        Some(Cleared {
            epoch,
            removal: self.removal(),
        })
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

/// Deletes every key of `namespace` but its epoch, in chunks, noting the progress in `removal`; each step
/// is bounded by `step`, the whole is not.
async fn remove_old(
    mut c: redis::aio::MultiplexedConnection,
    namespace: String,
    epoch_key: String,
    removal: Arc<Mutex<Removal>>,
    step: Duration,
) {
    let note = |f: &dyn Fn(&mut Removal)| {
        if let Ok(mut r) = removal.lock() {
            f(&mut r);
        }
    };
    let mut cursor: u64 = 0;
    loop {
        let scanned = tokio::time::timeout(step, async {
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{namespace}:*"))
                .arg("COUNT")
                .arg(1000)
                .query_async::<(u64, Vec<String>)>(&mut c)
                .await
        })
        .await;
        let (next, keys) = match scanned {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return note(&|r| fail(r, e.to_string())),
            Err(_) => return note(&|r| fail(r, "a scan step outlasted its budget".into())),
        };
        let keys: Vec<String> = keys.into_iter().filter(|k| *k != epoch_key).collect();
        if !keys.is_empty() {
            match tokio::time::timeout(step, c.del::<_, usize>(&keys)).await {
                Ok(Ok(n)) => note(&|r| r.deleted += n),
                Ok(Err(e)) => return note(&|r| fail(r, e.to_string())),
                Err(_) => return note(&|r| fail(r, "a delete outlasted its budget".into())),
            }
        }
        if next == 0 {
            tracing::info!(namespace = %namespace, "shared answer cache: old keys removed");
            return note(&|r| r.state = "done");
        }
        cursor = next;
    }
}

fn fail(r: &mut Removal, why: String) {
    tracing::warn!(error = %why, "shared answer cache: removal of old keys stopped (they expire with their TTL)");
    r.state = "failed";
    r.error = Some(why);
}

/// A stored value that names its full key.
pub(crate) trait HasKey {
    fn key(&self) -> &str;
}
