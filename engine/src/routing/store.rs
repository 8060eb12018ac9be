//! The shared policy store (`[policy_store] kind = "redis"`): replicas behind one load balancer behave as one.
//! The policy and its version live in one Redis hash; a change is a compare-and-set on the version (a Lua
//! script, atomic in Redis) that also appends the audit line to one shared list and publishes the new version.
//! Every replica reads the hash every `sync_ms` and installs a newer version, so a change through any replica
//! reaches all of them within about `sync_ms`. A replica that loses Redis keeps serving its last policy, says so
//! in `/ready` and in `tiergate_policy_store_up`, and refuses policy changes (503) until Redis is back.
//!
//! Each cascade stage's policy (a route's stage after the first) has a hash of its own,
//! `{key}:stage:{route}:{stage}`, kept in step the same way; a steered generate route's θ policy too, under
//! `{key}:route:{route}`. Every hash carries the `format` it was written in
//! ([`FORMAT`]; none: 1, the replicas before stages). A replica never installs a policy written in a newer
//! format (it could misread it) and the store refuses its writes over one (it would drop what it does not
//! know), so during a rollout replicas of two versions neither misread nor lose each other's changes; replicas
//! of the version before stages read and write only the routing policy's hash, which keeps its shape.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::AsyncCommands;
use tiergate_config::{PolicyStoreConfig, RoutingConfig};

use crate::deps::Dependency;
use crate::routing::policy::Policy;

/// The format this replica writes and reads: the policy as `RoutingConfig`'s JSON (the routing policy's hash and
/// the stages' have the same shape). 1: the replicas before the error bound; 2 adds `mode = "risk"`,
/// `max_error`, `confidence`, `on_breach` and `audit_rate`, which a format-1 replica would refuse to parse;
/// 3 adds `allow_flawed_calibration`.
pub(crate) const FORMAT: u64 = 3;

const CAS: &str = r"
local fmt = tonumber(redis.call('HGET', KEYS[1], 'format') or '1')
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if fmt > tonumber(ARGV[4]) then return {2, cur, fmt} end
if cur ~= tonumber(ARGV[1]) then return {0, cur, fmt} end
local new = cur + 1
redis.call('HSET', KEYS[1], 'version', new, 'policy', ARGV[2], 'format', ARGV[4])
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], -100000, -1)
redis.call('PUBLISH', KEYS[3], new)
return {1, new, tonumber(ARGV[4])}
";

/// A Redis-backed policy store. Its calls go through one of two dependencies ([`crate::deps`]): the
/// policy's (the syncs, a change, heads: ten times `timeout_ms`) and the session pins' (on a request's path:
/// `timeout_ms`), each with its breaker; a connection is never made under a lock.
pub(crate) struct RedisStore {
    client: redis::Client,
    conn: crate::deps::Kept,
    key: String,
    sync: Duration,
    policy: Arc<Dependency>,
    pins: Arc<Dependency>,
}

/// What a compare-and-set did.
pub(crate) enum Cas {
    /// Stored at this version.
    Stored(u64),
    /// The store is at this other version.
    Conflict(u64),
    /// The stored policy was written in this newer format: not overwritten.
    Newer(u64),
}

/// A stored policy as this replica reads it.
pub(crate) enum Stored {
    /// Nothing stored yet.
    Empty,
    /// The policy and its version.
    Policy(RoutingConfig, u64),
    /// Written in this newer format (by a newer replica): not read.
    Newer(u64),
    /// Its JSON does not parse as a policy (a hand edit): not read.
    Unreadable(u64),
}

impl RedisStore {
    /// A store for `cfg` (no connection is made yet).
    pub(crate) fn new(cfg: &PolicyStoreConfig) -> anyhow::Result<Self> {
        let deadline = Duration::from_millis(cfg.timeout_ms);
        Ok(Self {
            client: redis::Client::open(cfg.url.as_str())?,
            conn: crate::deps::Kept::default(),
            key: cfg.key.clone(),
            sync: Duration::from_millis(cfg.sync_ms),
            policy: Dependency::new("policy_store", deadline * 10),
            pins: Dependency::new("session_pins", deadline),
        })
    }

    /// Its dependencies: the policy's and the pins'.
    pub(crate) fn dependencies(&self) -> [&Arc<Dependency>; 2] {
        [&self.policy, &self.pins]
    }

    /// The key prefix.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// How often replicas exchange state.
    pub(crate) fn period(&self) -> Duration {
        self.sync
    }

    /// Adds each `(key, delta)` to its shared counter (a day's expiry, renewed) and returns the totals, in order.
    pub(crate) async fn add_counters(
        &self,
        deltas: &[(String, f64)],
    ) -> redis::RedisResult<Vec<f64>> {
        let r = self
            .call(&self.policy, async {
                let mut c = self.conn.get(&self.client).await?;
                let mut pipe = redis::pipe();
                for (key, delta) in deltas {
                    pipe.cmd("INCRBYFLOAT").arg(key).arg(*delta);
                    pipe.cmd("EXPIRE").arg(key).arg(86_400).ignore();
                }
                let totals: Vec<f64> = pipe.query_async(&mut c).await?;
                Ok(totals)
            })
            .await;
        self.note(r)
    }

    /// The string at `key` (none when absent or expired).
    pub(crate) async fn get_value(&self, key: &str) -> redis::RedisResult<Option<String>> {
        self.call(&self.pins, async {
            let mut c = self.conn.get(&self.client).await?;
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await
    }

    /// Sets `prefix + member` to `value`, expiring after `ttl_ms`, and records it in `set` (a sorted set by
    /// time of the keys one owner holds) trimmed in the same script: its expired members, then its oldest past
    /// `max_members`, whose keys are deleted with them.
    pub(crate) async fn set_bounded(
        &self,
        prefix: &str,
        member: &str,
        value: &str,
        set: &str,
        (ttl_ms, max_members): (u64, usize),
    ) -> redis::RedisResult<()> {
        const PUT: &str = r"
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('SET', ARGV[1] .. ARGV[2], ARGV[4], 'PX', ttl)
redis.call('ZADD', KEYS[1], ms, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - ttl)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if over > 0 then
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do redis.call('DEL', ARGV[1] .. m) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 0";
        self.call(&self.pins, async {
            let mut c = self.conn.get(&self.client).await?;
            redis::Script::new(PUT)
                .key(set)
                .arg(prefix)
                .arg(member)
                .arg(ttl_ms.max(1))
                .arg(value)
                .arg(max_members)
                .invoke_async(&mut c)
                .await
        })
        .await
    }

    /// Whether the policy's last exchange with Redis worked.
    pub(crate) fn is_up(&self) -> bool {
        self.policy.is_up()
    }

    /// Runs `call` (its connection included) within `dep`'s deadline, when its breaker lets it; a failed or
    /// late one drops the connection (the next call connects again).
    async fn call<T>(
        &self,
        dep: &Dependency,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let r = dep.call(call).await;
        if r.is_err() {
            self.conn.forget();
        }
        r.map_err(refused)
    }

    /// Says whether the policy store answers (`tiergate_policy_store_up`).
    fn note<T>(&self, r: redis::RedisResult<T>) -> redis::RedisResult<T> {
        metrics::gauge!(crate::metrics::POLICY_STORE_UP).set(if self.is_up() { 1.0 } else { 0.0 });
        r
    }

    /// The routing policy's hash.
    pub(crate) fn routing_key(&self) -> &str {
        &self.key
    }

    /// The hash of `route`'s stage `stage`'s policy.
    pub(crate) fn stage_key(&self, route: &str, stage: &str) -> String {
        format!("{}:stage:{route}:{stage}", self.key)
    }

    /// The hash of a route's own policy: its stage `stage`'s, or (none) a steered route's.
    pub(crate) fn policy_key(&self, route: &str, stage: Option<&str>) -> String {
        match stage {
            Some(st) => self.stage_key(route, st),
            None => format!("{}:route:{route}", self.key),
        }
    }

    /// The key of `route`'s promoted head.
    pub(crate) fn head_key(&self, route: &str) -> String {
        format!("{}:head:{route}", self.key)
    }

    /// Writes `head` as `route`'s head in force if the record names `expected` or none was written yet (one
    /// Lua script: compare-and-set); `Some(record)` when another head is recorded (nothing written).
    pub(crate) async fn swap_head(
        &self,
        route: &str,
        expected: &str,
        head: &crate::routing::heads::SharedHead,
    ) -> redis::RedisResult<Option<crate::routing::heads::SharedHead>> {
        const SWAP: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if not ok or rec['version'] ~= ARGV[1] then return cur end
end
redis.call('SET', KEYS[1], ARGV[2])
return false";
        let key = self.head_key(route);
        let json = serde_json::to_string(head).unwrap_or_default();
        let r = self
            .call(&self.policy, async {
                let mut c = self.conn.get(&self.client).await?;
                redis::Script::new(SWAP)
                    .key(&key)
                    .arg(expected)
                    .arg(json)
                    .invoke_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        let other = self.note(r)?;
        Ok(other.map(|raw| {
            serde_json::from_str(&raw).unwrap_or(crate::routing::heads::SharedHead {
                version: "(unreadable)".into(),
                dir: None,
                at_ms: 0,
            })
        }))
    }

    /// `route`'s promoted head, when one was published (an unreadable value reads as none).
    pub(crate) async fn get_head(
        &self,
        route: &str,
    ) -> redis::RedisResult<Option<crate::routing::heads::SharedHead>> {
        let key = self.head_key(route);
        let r = self
            .call(&self.policy, async {
                let mut c = self.conn.get(&self.client).await?;
                c.get::<_, Option<String>>(&key).await
            })
            .await;
        let raw = self.note(r)?;
        Ok(raw.and_then(|s| serde_json::from_str(&s).ok()))
    }

    /// The policy stored in the hash `key`.
    pub(crate) async fn fetch(&self, key: &str) -> redis::RedisResult<Stored> {
        let r = self
            .call(&self.policy, async {
                let mut c = self.conn.get(&self.client).await?;
                let (version, policy, format): (Option<u64>, Option<String>, Option<u64>) =
                    c.hget(key, &["version", "policy", "format"]).await?;
                Ok(match (version, policy, format.unwrap_or(1)) {
                    (Some(_), Some(_), f) if f > FORMAT => Stored::Newer(f),
                    (Some(v), Some(p), _) => serde_json::from_str(&p)
                        .map_or(Stored::Unreadable(v), |cfg| Stored::Policy(cfg, v)),
                    _ => Stored::Empty,
                })
            })
            .await;
        self.note(r)
    }

    /// Stores `cfg` as the version after `expected`, appending `audit` to the shared audit log, if the store
    /// is still at `expected` (0: nothing stored yet) and was not written in a newer format.
    pub(crate) async fn compare_and_set(
        &self,
        key: &str,
        expected: u64,
        cfg: &RoutingConfig,
        audit: &str,
    ) -> redis::RedisResult<Cas> {
        let r = self
            .call(&self.policy, async {
                let mut c = self.conn.get(&self.client).await?;
                let policy = serde_json::to_string(cfg).unwrap_or_default();
                let (stored, version, format): (u8, u64, u64) = redis::Script::new(CAS)
                    .key(key)
                    .key(format!("{}:audit", self.key))
                    .key(format!("{}:changes", self.key))
                    .arg(expected)
                    .arg(policy)
                    .arg(audit)
                    .arg(FORMAT)
                    .invoke_async(&mut c)
                    .await?;
                Ok(match stored {
                    1 => Cas::Stored(version),
                    2 => Cas::Newer(format),
                    _ => Cas::Conflict(version),
                })
            })
            .await;
        self.note(r)
    }
}

/// A call not made or not answered, as the Redis error its callers handle.
fn refused(r: crate::deps::Refused) -> redis::RedisError {
    match r {
        crate::deps::Refused::Failed(e) => {
            redis::RedisError::from((redis::ErrorKind::IoError, "redis failed", e))
        }
        other => redis::RedisError::from((
            redis::ErrorKind::IoError,
            "redis not answered",
            other.to_string(),
        )),
    }
}

/// Keeps this replica's `policy` in step with the hash `key` until the policy is dropped (with the server's
/// state): at start the stored policy wins (or this replica's config is stored as the first version), then
/// every `sync_ms` a newer stored version is installed. A policy in a newer format or one that does not parse
/// is not installed (said once in the log; the policy in force stays).
pub(crate) async fn sync_policy(store: Arc<RedisStore>, key: String, policy: Weak<Policy>) {
    let mut seeded = false;
    let mut refused: Option<String> = None;
    loop {
        let Some(policy) = policy.upgrade() else {
            return;
        };
        match store.fetch(&key).await {
            Ok(Stored::Policy(cfg, version)) => {
                let adopt = !seeded;
                seeded = true;
                refused = None;
                if policy.install(cfg, version, adopt) {
                    tracing::info!(
                        key,
                        version,
                        "routing policy from the shared store installed"
                    );
                }
            }
            Ok(Stored::Empty) if !seeded => {
                // Nothing stored yet: this replica's policy becomes version 1 of the shared one.
                let local = policy.current();
                let line =
                    serde_json::json!({"event": "seeded", "version": 1, "key": key}).to_string();
                if let Ok(Cas::Stored(v)) = store.compare_and_set(&key, 0, &local.cfg, &line).await
                {
                    policy.install(local.cfg.clone(), v, true);
                    seeded = true;
                }
            }
            Ok(Stored::Newer(f)) => {
                let why = format!("written in format {f} (this replica reads up to {FORMAT}): upgrade this replica");
                warn_once(&mut refused, &key, why);
            }
            Ok(Stored::Unreadable(v)) => {
                warn_once(
                    &mut refused,
                    &key,
                    format!("version {v} does not parse as a policy"),
                );
            }
            _ => {}
        }
        let period = store.sync;
        drop(policy);
        tokio::time::sleep(period).await;
    }
}

/// Logs why the shared policy in `key` is not installed, once per reason.
fn warn_once(said: &mut Option<String>, key: &str, why: String) {
    if said.as_deref() != Some(why.as_str()) {
        tracing::warn!(
            key,
            "the shared policy is not installed (the policy in force stays): {why}"
        );
        *said = Some(why);
    }
}
