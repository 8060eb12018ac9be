//! Session pins (`[sessions]`): the stage and backend that wrote a session's last LLM turn, so that its next
//! turn goes there too (a warm prompt cache; a follow-up judged with the model that wrote what it follows).
//! Keyed by a digest of tenant, route, the model asked for and session key (the key itself is never stored); a
//! pin records its route's stages (a fingerprint: a pin made under other stages or backends is not applied)
//! and when it was made (`max_age_s`); in memory, bounded and
//! least-recently-used first out, with a TTL renewed by each turn; in Redis under the policy store's key when
//! the policy store is Redis (every replica reads the same pin; memory serves while Redis is down).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tiergate_config::SessionsConfig;

use crate::routing::store::RedisStore;

/// Where a session's last LLM turn was written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pin {
    /// The stage's index in its route.
    pub stage: usize,
    /// The backend's name.
    pub backend: String,
    /// The route's stages when it was made ([`crate::routing::route::Route::stage_fingerprint`]).
    pub route: u64,
    /// When the session was first pinned (Unix ms): its pin lives `max_age_s` at most.
    pub born_ms: u64,
    /// A digest of the conversation that made it (its first user message).
    pub conversation: u64,
    /// Turns of another conversation came under the same key (a `prompt_cache_key` or `user` many share):
    /// the pin yields under load.
    pub shared: bool,
    /// The session's spend so far (its turns' and its moves' backend time): what its switch budget is a
    /// share of.
    pub spent: Spend,
    /// The backend the session last moved away from (a digest of its name; 0: none) and the conversation's
    /// tokens it held then: a move back reads only what came since.
    pub left: (u64, u32),
}

impl Pin {
    /// The digest a pin records a backend's name by.
    pub(crate) fn backend_digest(name: &str) -> u64 {
        let d = Sha256::digest(name.as_bytes());
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]).max(1)
    }
}

impl Pin {
    fn encode(&self) -> String {
        format!(
            "{}\t{:016x}\t{}\t{:016x}\t{}\t{:.0}\t{:.0}\t{:016x}\t{}\t{}",
            self.stage,
            self.route,
            self.born_ms,
            self.conversation,
            u8::from(self.shared),
            self.spent.total_ms,
            self.spent.moves_ms,
            self.left.0,
            self.left.1,
            self.backend
        )
    }

    /// A pin as [`Pin::encode`] wrote it (one of an older format reads as none).
    fn decode(s: &str) -> Option<Self> {
        let mut parts = s.splitn(10, '\t');
        let mut next = || parts.next();
        let (stage, route, born) = (next()?, next()?, next()?);
        let (conversation, shared) = (next()?, next()?);
        let (total, moves, left, left_tokens) = (next()?, next()?, next()?, next()?);
        let backend = next()?;
        Some(Self {
            left: (
                u64::from_str_radix(left, 16).ok()?,
                left_tokens.parse().ok()?,
            ),
            spent: Spend {
                total_ms: total.parse().ok()?,
                moves_ms: moves.parse().ok()?,
            },
            stage: stage.parse().ok()?,
            route: u64::from_str_radix(route, 16).ok()?,
            born_ms: born.parse().ok()?,
            conversation: u64::from_str_radix(conversation, 16).ok()?,
            shared: shared == "1",
            backend: backend.to_string(),
        })
    }
}

/// A session's spend so far, ms: its turns' time (moves included) and its moves'.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spend {
    pub total_ms: f64,
    pub moves_ms: f64,
}

/// A session's key: a digest of tenant, route, the model the client asked for and the client's session key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey([u8; 16]);

impl SessionKey {
    pub(crate) fn of(tenant: &str, route: &str, model: &str, session: &str) -> Self {
        let mut h = Sha256::new();
        for part in [tenant, route, model, session] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let mut k = [0u8; 16];
        k.copy_from_slice(&h.finalize()[..16]);
        Self(k)
    }

    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

struct Entry {
    pin: Pin,
    tenant: Arc<str>,
    at: Instant,
    touch: u64,
}

/// The pins in memory, least recently used first out: per tenant at most its share (its own oldest go), and
/// past the replica's bound the tenant holding the most gives way — one tenant's flood of sessions evicts no
/// other tenant's pins.
#[derive(Default)]
struct Memory {
    map: HashMap<SessionKey, Entry>,
    /// Each tenant's touches in order (key, touch number): an entry whose number is not its last is stale.
    order: HashMap<Arc<str>, VecDeque<(SessionKey, u64)>>,
    /// Live pins per tenant.
    held: HashMap<Arc<str>, usize>,
    /// Live pins per backend: the sessions each one holds.
    on: HashMap<String, usize>,
    touches: u64,
}

impl Memory {
    fn put(&mut self, key: SessionKey, tenant: &str, pin: Pin, now: Instant, bounds: Bounds) {
        let Bounds { max, share, ttl } = bounds;
        self.touches += 1;
        let touch = self.touches;
        let tenant: Arc<str> = match self.held.get_key_value(tenant) {
            Some((t, _)) => t.clone(),
            None => Arc::from(tenant),
        };
        let entry = Entry {
            pin,
            tenant: tenant.clone(),
            at: now,
            touch,
        };
        *self.on.entry(entry.pin.backend.clone()).or_default() += 1;
        if let Some(old) = self.map.insert(key, entry) {
            self.forget(&old.tenant);
            self.off(&old.pin.backend);
        }
        *self.held.entry(tenant.clone()).or_default() += 1;
        self.order
            .entry(tenant.clone())
            .or_default()
            .push_back((key, touch));
        self.drop_expired(&tenant, now, ttl);
        while self.held.get(&tenant).copied().unwrap_or(0) > share {
            self.evict_oldest(&tenant);
        }
        while self.map.len() > max {
            let Some(most) = self
                .held
                .iter()
                // The tenant holding the most; on a tie, the one writing now (an order that does not
                // depend on the map's).
                .max_by_key(|(t, n)| (**n, **t == tenant))
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            self.evict_oldest(&most);
        }
        self.compact(&tenant);
    }

    /// One pin on `backend` less.
    fn off(&mut self, backend: &str) {
        if let Some(n) = self.on.get_mut(backend) {
            *n -= 1;
            if *n == 0 {
                self.on.remove(backend);
            }
        }
    }

    /// Removes the pin at `key`.
    fn remove(&mut self, key: &SessionKey) {
        if let Some(e) = self.map.remove(key) {
            self.forget(&e.tenant);
            self.off(&e.pin.backend);
        }
    }

    /// Drops `tenant`'s pins idle past `ttl`, least recently used first (so that the pins each backend holds
    /// are the live sessions', not ended ones').
    fn drop_expired(&mut self, tenant: &Arc<str>, now: Instant, ttl: Duration) {
        while let Some(&(k, t)) = self.order.get(tenant).and_then(VecDeque::front) {
            if let Some(e) = self.map.get(&k).filter(|e| e.touch == t) {
                if now.saturating_duration_since(e.at) <= ttl {
                    return;
                }
                self.remove(&k);
            }
            if let Some(o) = self.order.get_mut(tenant) {
                o.pop_front();
            }
        }
    }

    /// One pin of `tenant` less.
    fn forget(&mut self, tenant: &Arc<str>) {
        if let Some(n) = self.held.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(tenant);
                self.order.remove(tenant);
            }
        }
    }

    /// Drops `tenant`'s least recently used pin.
    fn evict_oldest(&mut self, tenant: &Arc<str>) {
        while let Some((k, t)) = self.order.get_mut(tenant).and_then(VecDeque::pop_front) {
            if self.map.get(&k).is_some_and(|e| e.touch == t) {
                self.remove(&k);
                return;
            }
        }
    }

    /// Drops `tenant`'s stale touches once they outnumber its live pins.
    fn compact(&mut self, tenant: &Arc<str>) {
        let live = self.held.get(tenant).copied().unwrap_or(0);
        let map = &self.map;
        if let Some(order) = self.order.get_mut(tenant) {
            if order.len() > 2 * live + 16 {
                order.retain(|(k, t)| map.get(k).is_some_and(|e| e.touch == *t));
            }
        }
    }

    fn get(&mut self, key: &SessionKey, now: Instant, ttl: Duration) -> Option<Pin> {
        let e = self.map.get(key)?;
        if now.saturating_duration_since(e.at) > ttl {
            self.remove(key);
            return None;
        }
        Some(e.pin.clone())
    }
}

/// A replica's bounds on its pins: in all, per tenant, and their idle life.
#[derive(Clone, Copy)]
struct Bounds {
    max: usize,
    share: usize,
    ttl: Duration,
}

/// The pins.
pub(crate) struct Sessions {
    cfg: SessionsConfig,
    memory: Mutex<Memory>,
    redis: Option<Arc<RedisStore>>,
}

impl Sessions {
    pub(crate) fn new(cfg: &SessionsConfig, redis: Option<Arc<RedisStore>>) -> Self {
        Self {
            cfg: cfg.clone(),
            memory: Mutex::new(Memory::default()),
            redis,
        }
    }

    /// Whether sessions are pinned.
    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.cfg.ttl_s)
    }

    /// `key`'s pin, if it has one that has not expired: Redis's when it answers within the pins' deadline, else
    /// this replica's (a Redis that does not answer costs one deadline, then nothing while its breaker is open).
    pub(crate) async fn get(&self, key: &SessionKey) -> Option<Pin> {
        if !self.cfg.enabled {
            return None;
        }
        if let Some(r) = &self.redis {
            if let Ok(v) = r.get_value(&self.redis_key(r, key)).await {
                return v.as_deref().and_then(Pin::decode);
            }
        }
        let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key, Instant::now(), self.ttl())
    }

    /// Pins `key` (a session of `tenant`) to `pin` for the TTL from now: in memory at once, and in Redis when it is the store (written
    /// in the background within the pins' deadline: the turn does not wait for it).
    pub(crate) fn put(&self, key: &SessionKey, tenant: &str, pin: Pin) {
        if !self.cfg.enabled {
            return;
        }
        if let Some(r) = &self.redis {
            // The tenant's pins in Redis are bounded as in memory: its own oldest go past its share.
            let prefix = format!("{}:pin:", r.key());
            let set = format!("{}:pins-of:{tenant}", r.key());
            let (r, member, v) = (r.clone(), key.hex(), pin.encode());
            let bound = (self.ttl().as_millis() as u64, self.cfg.max_pins_per_tenant);
            tokio::spawn(async move {
                let _ = r.set_bounded(&prefix, &member, &v, &set, bound).await;
            });
        }
        let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        let bounds = Bounds {
            max: self.cfg.max_pins,
            share: self.cfg.max_pins_per_tenant,
            ttl: self.ttl(),
        };
        m.put(*key, tenant, pin, Instant::now(), bounds);
        metrics::gauge!(crate::metrics::SESSION_PINS).set(m.map.len() as f64);
    }

    /// Live sessions pinned to `backend` in this replica's memory.
    pub(crate) fn held_on(&self, backend: &str) -> usize {
        self.memory
            .lock()
            .map_or(0, |m| m.on.get(backend).copied().unwrap_or(0))
    }

    /// Pins held in this replica's memory.
    pub(crate) fn len(&self) -> usize {
        self.memory.lock().map_or(0, |m| m.map.len())
    }

    fn redis_key(&self, r: &RedisStore, key: &SessionKey) -> String {
        format!("{}:pin:{}", r.key(), key.hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(max: usize, share: usize) -> Bounds {
        Bounds {
            max,
            share,
            ttl: Duration::from_secs(10),
        }
    }

    fn pin(stage: usize, b: &str) -> Pin {
        Pin {
            stage,
            backend: b.into(),
            route: 7,
            born_ms: 1_000,
            conversation: 9,
            shared: false,
            spent: Default::default(),
            left: (0, 0),
        }
    }

    #[test]
    fn pins_are_bounded_least_recently_used_first_out_and_expire() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let k = |i: u8| SessionKey::of("t", "r", "m", &i.to_string());
        m.put(k(1), "t", pin(0, "a"), t0, b(2, 2));
        m.put(k(2), "t", pin(0, "b"), t0, b(2, 2));
        // Session 1's new turn makes session 2 the least recently used.
        m.put(k(1), "t", pin(1, "c"), t0, b(2, 2));
        m.put(k(3), "t", pin(0, "a"), t0, b(2, 2));
        assert_eq!(m.get(&k(1), t0, ttl), Some(pin(1, "c")));
        assert_eq!(m.get(&k(2), t0, ttl), None);
        assert_eq!(m.get(&k(3), t0, ttl), Some(pin(0, "a")));
        assert_eq!(m.get(&k(3), t0 + Duration::from_secs(11), ttl), None);
        // Many turns of one session do not grow the order without bound.
        for _ in 0..1000 {
            m.put(k(1), "t", pin(0, "a"), t0, b(2, 2));
        }
        assert!(
            m.order["t"].len() <= 2 * 2 + 16 + 1,
            "{}",
            m.order["t"].len()
        );
        // Session 3's pin was dropped when read past its TTL.
        assert_eq!(m.map.len(), 1);
    }

    #[test]
    fn one_tenants_flood_of_sessions_evicts_no_other_tenants_pins() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let k = |t: &str, i: usize| SessionKey::of(t, "r", "m", &i.to_string());
        for i in 0..3 {
            m.put(k("b", i), "b", pin(0, "x"), t0, b(10, 4));
        }
        for i in 0..1000 {
            m.put(k("a", i), "a", pin(0, "x"), t0, b(10, 4));
        }
        for i in 0..3 {
            assert_eq!(m.get(&k("b", i), t0, ttl), Some(pin(0, "x")), "b's pin {i}");
        }
        assert_eq!(m.held["a"], 4, "a keeps its share, its own oldest gone");
        assert_eq!(m.get(&k("a", 999), t0, ttl), Some(pin(0, "x")));
        assert_eq!(m.get(&k("a", 995), t0, ttl), None);
        // Past the replica's bound (9 here) the tenant holding the most gives way: c's third pin evicts one
        // of a's, none of b's.
        for i in 0..3 {
            m.put(k("c", i), "c", pin(0, "x"), t0, b(9, 4));
        }
        assert_eq!(m.map.len(), 9);
        assert_eq!((m.held["a"], m.held["b"], m.held["c"]), (3, 3, 3));
        // A tie (a and c at 4 with a bound of 10) goes against the tenant writing: c's own oldest.
        m.put(k("a", 1000), "a", pin(0, "x"), t0, b(10, 4));
        m.put(k("c", 3), "c", pin(0, "x"), t0, b(10, 4));
        assert_eq!((m.held["a"], m.held["b"], m.held["c"]), (4, 3, 3));
        assert_eq!(m.get(&k("c", 0), t0, ttl), None);
        assert!(m.order["a"].len() <= 2 * 4 + 16 + 1);
    }

    #[test]
    fn keys_are_per_tenant_route_and_model_and_pins_round_trip() {
        let k = SessionKey::of;
        assert_ne!(k("a", "r", "m", "s"), k("b", "r", "m", "s"));
        assert_ne!(k("a", "r", "m", "s"), k("a", "q", "m", "s"));
        // A side call to another model under the same session has its own pin.
        assert_ne!(k("a", "r", "sonnet", "s"), k("a", "r", "haiku", "s"));
        // Lengths are part of the digest: ("ab", "c") is not ("a", "bc").
        assert_ne!(k("ab", "c", "m", "s"), k("a", "bc", "m", "s"));
        let p = pin(2, "qwen\tx");
        assert_eq!(Pin::decode(&p.encode()), Some(p));
        let shared = Pin {
            shared: true,
            spent: Spend {
                total_ms: 1234.0,
                moves_ms: 56.0,
            },
            left: (Pin::backend_digest("big"), 1500),
            ..pin(0, "q")
        };
        assert_eq!(Pin::decode(&shared.encode()), Some(shared));
        // Pins of older formats read as none (the last two: before the session's spend, before where it left).
        assert_eq!(
            Pin::decode("1\t0000000000000007\t1000\t0000000000000009\t0\t10\t0\tqwen"),
            None
        );
        assert_eq!(
            Pin::decode("1\t0000000000000007\t1000\t0000000000000009\t0\tqwen"),
            None
        );
        assert_eq!(Pin::decode("1\tqwen"), None);
        assert_eq!(Pin::decode("1\t0000000000000007\t1000\tqwen"), None);
        assert_eq!(Pin::decode("x\ty"), None);
    }

    /// In Redis as in memory: one tenant's flood of sessions leaves it its own newest `max_pins_per_tenant`
    /// pins (its oldest deleted with their keys) and every other tenant's pin in place (a real `redis-server`).
    #[tokio::test]
    async fn a_tenants_pins_in_redis_are_bounded_by_its_share() {
        let port = crate::testing::free_port();
        let mut server = crate::testing::redis_server(port);
        let store = tiergate_config::PolicyStoreConfig {
            url: format!("redis://127.0.0.1:{port}/0"),
            key: "pt".into(),
            timeout_ms: 1000,
            ..Default::default()
        };
        let redis = Arc::new(RedisStore::new(&store).unwrap());
        let cfg = SessionsConfig {
            max_pins: 100,
            max_pins_per_tenant: 5,
            ..Default::default()
        };
        let sessions = Sessions::new(&cfg, Some(redis.clone()));
        let k = |t: &str, i: usize| SessionKey::of(t, "r", "m", &i.to_string());
        let settle = || tokio::time::sleep(Duration::from_millis(20));
        for i in 0..3 {
            sessions.put(&k("b", i), "b", pin(0, "x"));
            settle().await;
        }
        for i in 0..40 {
            sessions.put(&k("a", i), "a", pin(0, "x"));
            settle().await;
        }
        let mut c = redis::Client::open(store.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let pins: Vec<String> = redis::cmd("KEYS")
            .arg("pt:pin:*")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(pins.len(), 3 + 5, "{pins:?}");
        let of_a: u64 = redis::cmd("ZCARD")
            .arg("pt:pins-of:a")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(of_a, 5);
        let key = |t: &str, i: usize| format!("pt:pin:{}", k(t, i).hex());
        for i in 0..3 {
            assert!(pins.contains(&key("b", i)), "b's pin {i}");
        }
        for i in 35..40 {
            assert!(pins.contains(&key("a", i)), "a's newest {i}");
        }
        // What a replica reads from Redis: a's oldest are gone there.
        let fresh = Sessions::new(&cfg, Some(redis));
        assert_eq!(fresh.get(&k("a", 39)).await, Some(pin(0, "x")));
        assert_eq!(fresh.get(&k("a", 0)).await, None);
        assert_eq!(fresh.get(&k("b", 0)).await, Some(pin(0, "x")));
        let _ = server.kill();
        let _ = server.wait();
    }
}
