//! Tenants of the public API (`[[tenants]]`): the presented `Authorization: Bearer <key>` is hashed and its
//! SHA-256 looked up (the config holds digests, never keys), then the tenant's route list and request rate (a
//! token bucket) are applied. Without tenants the API is open. The admin listener, the
//! console and the θ override header stay behind the admin token, apart from tenants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tiergate_config::TenantConfig;

use crate::error::EngineError;
pub(crate) use crate::model::request::TenantId;

/// A token bucket: `rate` tokens a second up to `burst`; a request takes one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    /// Tokens taken here since the last exchange with the other replicas ([`crate::tasks::tenants_sync`]).
    unsynced: f64,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            at: now,
            unsynced: 0.0,
        }
    }

    /// Takes one token at `now`, or says how long until one is there.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.unsynced += 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

impl Shared for Bucket {
    fn take_unsynced(&mut self) -> f64 {
        std::mem::take(&mut self.unsynced)
    }

    fn absorb(&mut self, taken: f64) {
        self.tokens = (self.tokens - taken).max(-self.burst);
    }
}

/// A limit whose use is shared with the other replicas: what was used here since the last exchange, and
/// what the others used (taken from this replica's allowance, down to at most one full allowance of debt).
pub(crate) trait Shared {
    /// Use here since the last call.
    fn take_unsynced(&mut self) -> f64;
    /// Use by the other replicas.
    fn absorb(&mut self, taken: f64);
}

/// A tenant's LLM budget in LLM-seconds: refilled at `per_min / 60` a second up to one minute's worth, and
/// charged after each job with the time it held a worker (so it can go below zero; the tenant then waits
/// until it is paid back).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Budget {
    per_s: f64,
    cap: f64,
    left: f64,
    at: Instant,
    unsynced: f64,
}

impl Shared for Budget {
    fn take_unsynced(&mut self) -> f64 {
        std::mem::take(&mut self.unsynced)
    }

    fn absorb(&mut self, taken: f64) {
        self.left = (self.left - taken).max(-self.cap);
    }
}

impl Budget {
    /// A full budget of `per_min` LLM-seconds a minute.
    pub(crate) fn new(per_min: f64, now: Instant) -> Self {
        Self {
            per_s: per_min / 60.0,
            cap: per_min,
            left: per_min,
            at: now,
            unsynced: 0.0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.left = (self.left + elapsed * self.per_s).min(self.cap);
        self.at = now.max(self.at);
    }

    /// Whether a job may start at `now`, or how long until it may.
    pub(crate) fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.left > 0.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (-self.left / self.per_s).max(0.0) + 1e-3,
            ))
        }
    }

    /// Charges `secs` LLM-seconds at `now`.
    pub(crate) fn charge(&mut self, now: Instant, secs: f64) {
        self.refill(now);
        self.left -= secs;
        self.unsynced += secs;
    }

    /// LLM-seconds left at `now`.
    pub(crate) fn left(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.left
    }
}

/// One configured tenant.
#[derive(Debug)]
pub(crate) struct Tenant {
    pub id: TenantId,
    /// The routes it may use (`None`: all).
    routes: Option<Vec<String>>,
    /// Its rate and burst, and the bucket (kept across a reload that leaves both as they were).
    bucket: Option<Limited<(f64, f64), Bucket>>,
    /// Its LLM-seconds a minute and its budget (kept likewise).
    budget: Option<Limited<f64, Budget>>,
    /// Its fair-share weight at the LLM.
    pub weight: f64,
    /// Its batch quotas.
    pub quotas: Quotas,
    /// Its feedback counts as evidence (`feedback = "trusted"`).
    pub trusted_feedback: bool,
    /// Whose cached verdicts it reads and writes: its `cache_group`, else its own name.
    pub cache_group: Arc<str>,
}

/// A tenant's batch quotas (`None`: no quota of its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quotas {
    pub max_active_batches: Option<usize>,
    pub max_stored_bytes: Option<u64>,
}

/// A limit as configured, and its shared state.
type Limited<L, S> = (L, Arc<Mutex<S>>);

impl Tenant {
    /// Whether it may use route `name`.
    pub(crate) fn may_use(&self, name: &str) -> bool {
        self.routes
            .as_ref()
            .is_none_or(|r| r.iter().any(|x| x == name))
    }

    /// Its request-rate bucket, when it has one.
    pub(crate) fn bucket(&self) -> Option<&Arc<Mutex<Bucket>>> {
        self.bucket.as_ref().map(|(_, b)| b)
    }

    /// Its LLM budget, when it has one.
    pub(crate) fn budget(&self) -> Option<&Arc<Mutex<Budget>>> {
        self.budget.as_ref().map(|(_, b)| b)
    }

    /// Takes one request from its rate, or says how long until it may send one.
    pub(crate) fn admit(&self, now: Instant) -> Result<(), Duration> {
        match &self.bucket {
            Some((_, b)) => b.lock().map_or(Ok(()), |mut b| b.take(now)),
            None => Ok(()),
        }
    }
}

/// The tenants by key digest.
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    by_digest: HashMap<[u8; 32], Arc<Tenant>>,
    by_name: HashMap<String, Arc<Tenant>>,
}

impl Tenants {
    /// From `[[tenants]]` (validated: digests are 64 hex digits).
    pub(crate) fn new(cfg: &[TenantConfig]) -> Self {
        Self::default().reloaded(cfg)
    }

    /// The tenants of `cfg`, each keeping its bucket from `self` when its name, rate and burst are unchanged
    /// (a reload neither refills nor empties a tenant's rate).
    pub(crate) fn reloaded(&self, cfg: &[TenantConfig]) -> Self {
        let now = Instant::now();
        let mut t = Self::default();
        for c in cfg {
            let Some(digest) = parse_digest(&c.key_sha256) else {
                continue;
            };
            let bucket = c.rate_per_s.zip(c.burst_in_force()).map(|limits| {
                let kept = self
                    .named(&c.name)
                    .and_then(|old| old.bucket.as_ref())
                    .filter(|(l, _)| *l == limits)
                    .map(|(_, b)| b.clone());
                let b = kept
                    .unwrap_or_else(|| Arc::new(Mutex::new(Bucket::new(limits.0, limits.1, now))));
                (limits, b)
            });
            let budget = c.llm_seconds_per_min.map(|per_min| {
                let kept = self
                    .named(&c.name)
                    .and_then(|old| old.budget.as_ref())
                    .filter(|(l, _)| *l == per_min)
                    .map(|(_, b)| b.clone());
                let b = kept.unwrap_or_else(|| Arc::new(Mutex::new(Budget::new(per_min, now))));
                (per_min, b)
            });
            let tenant = Arc::new(Tenant {
                id: TenantId(Arc::from(c.name.as_str())),
                routes: c.routes.clone(),
                bucket,
                budget,
                weight: c.weight_in_force(),
                quotas: Quotas {
                    max_active_batches: c.max_active_batches,
                    max_stored_bytes: c.max_stored_bytes,
                },
                trusted_feedback: c.feedback == tiergate_config::FeedbackTrust::Trusted,
                cache_group: Arc::from(c.cache_group.as_deref().unwrap_or(c.name.as_str())),
            });
            t.by_digest.insert(digest, tenant.clone());
            t.by_name.insert(c.name.clone(), tenant);
        }
        t
    }

    /// Every tenant, by name.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.by_name.values()
    }

    /// The tenants' names, routes and limits (what `GET /admin/tenants` shows; never a digest).
    pub(crate) fn describe(&self) -> Vec<serde_json::Value> {
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|n| self.by_name.get(n))
            .map(|t| {
                serde_json::json!({
                    "name": &*t.id.0,
                    "routes": t.routes,
                    "rate_per_s": t.bucket.as_ref().map(|((r, _), _)| r),
                    "burst": t.bucket.as_ref().map(|((_, b), _)| b),
                    "llm_seconds_per_min": t.budget.as_ref().map(|(l, _)| l),
                    "llm_seconds_left": t.budget().and_then(|b| b.lock().ok().map(|mut b| b.left(Instant::now()))),
                    "weight": t.weight,
                    "max_active_batches": t.quotas.max_active_batches,
                    "max_stored_bytes": t.quotas.max_stored_bytes,
                })
            })
            .collect()
    }

    /// No tenants: the API is open.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The tenant whose key this is.
    pub(crate) fn lookup(&self, key: &str) -> Option<&Arc<Tenant>> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_digest.get(&digest)
    }

    /// The tenant named `name`.
    pub(crate) fn named(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_name.get(name)
    }

    /// 403 when tenant `id` may not use route `route` (identities that are no configured tenant — anonymous,
    /// the batch runner's — may use every route).
    pub(crate) fn permit(&self, id: &TenantId, route: &str) -> Result<(), EngineError> {
        match self.named(&id.0) {
            Some(t) if !t.may_use(route) => Err(EngineError::Forbidden(format!(
                "tenant `{}` may not use route `{route}`",
                id.0
            ))),
            _ => Ok(()),
        }
    }
}

/// What each tenant got since start (the console's per-tenant table): bounded, as tenant names come from the
/// config (and batch owners), never from a request.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    by: Mutex<HashMap<Arc<str>, Counts>>,
}

/// One tenant's figures.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct Counts {
    pub requests: u64,
    pub escalated: u64,
    pub degraded: u64,
    /// Degraded because its LLM budget was spent.
    pub over_budget: u64,
    pub errors: u64,
    /// LLM time its jobs held a worker.
    pub llm_seconds: f64,
}

impl Figures {
    fn with(&self, tenant: &Arc<str>, f: impl FnOnce(&mut Counts)) {
        if let Ok(mut by) = self.by.lock() {
            f(by.entry(tenant.clone()).or_default());
        }
    }

    /// An answered request of `tenant`.
    pub(crate) fn answered(&self, tenant: &TenantId, o: &crate::model::outcome::Outcome) {
        use crate::model::outcome::{Channel, DegradeReason};
        self.with(&tenant.0, |c| {
            c.requests += 1;
            match o.channel() {
                Channel::Escalated => c.escalated += 1,
                Channel::Degraded => c.degraded += 1,
                _ => {}
            }
            if o.degraded == Some(DegradeReason::Budget) {
                c.over_budget += 1;
            }
        });
    }

    /// A request of `tenant` that ended in an error.
    pub(crate) fn failed(&self, tenant: &TenantId) {
        self.with(&tenant.0, |c| {
            c.requests += 1;
            c.errors += 1;
        });
    }

    /// LLM time used by `tenant`.
    pub(crate) fn llm(&self, tenant: &Arc<str>, secs: f64) {
        self.with(tenant, |c| c.llm_seconds += secs);
    }

    /// Every tenant's figures, by name.
    pub(crate) fn snapshot(&self) -> Vec<(String, Counts)> {
        let mut v: Vec<(String, Counts)> = self
            .by
            .lock()
            .map(|by| by.iter().map(|(k, c)| (k.to_string(), *c)).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_refills_at_its_rate_up_to_its_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(2.0, 3.0, t0);
        for _ in 0..3 {
            assert!(b.take(t0).is_ok());
        }
        // Empty: one token comes after half a second.
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(250)).is_err());
        assert!(b.take(t0 + Duration::from_millis(500)).is_ok());
        // Long idle: back to the burst, not beyond.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.take(later).is_ok());
        }
        assert!(b.take(later).is_err());
        // A clock read out of order does not mint tokens.
        assert!(b.take(t0).is_err());
    }

    fn cfg(name: &str, key: &str) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            key_sha256: format!("{:x}", Sha256::digest(key.as_bytes())),
            routes: Some(vec!["classify".into()]),
            rate_per_s: Some(1.0),
            burst: Some(1.0),
            ..TenantConfig::default()
        }
    }

    #[test]
    fn the_llm_budget_is_charged_after_the_fact_and_paid_back_at_its_rate() {
        let t0 = Instant::now();
        // 6 LLM-seconds a minute: 0.1 a second, at most 6 banked.
        let mut b = Budget::new(6.0, t0);
        assert!(b.check(t0).is_ok());
        b.charge(t0, 5.0);
        assert!(b.check(t0).is_ok());
        // One long job overdraws it: the next waits until the debt is repaid.
        b.charge(t0, 3.0);
        let wait = b.check(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 20.0).abs() < 0.01, "{wait:?}");
        assert!(b.check(t0 + Duration::from_secs(19)).is_err());
        assert!(b.check(t0 + Duration::from_secs(21)).is_ok());
        // Idle: full again, never beyond a minute's worth.
        assert!((b.left(t0 + Duration::from_secs(3600)) - 6.0).abs() < 1e-9);
    }

    #[test]
    fn a_reload_keeps_a_budget_whose_limit_is_unchanged() {
        let mut c = cfg("a", "key-a");
        c.llm_seconds_per_min = Some(6.0);
        c.weight = Some(2.0);
        let t = Tenants::new(std::slice::from_ref(&c));
        let a = t.named("a").unwrap();
        assert_eq!(a.weight, 2.0);
        a.budget()
            .unwrap()
            .lock()
            .unwrap()
            .charge(Instant::now(), 6.0);
        let kept = t.reloaded(std::slice::from_ref(&c));
        assert!(
            kept.named("a")
                .unwrap()
                .budget()
                .unwrap()
                .lock()
                .unwrap()
                .left(Instant::now())
                < 0.1
        );
        c.llm_seconds_per_min = Some(12.0);
        let fresh = t.reloaded(&[c]);
        assert!(
            fresh
                .named("a")
                .unwrap()
                .budget()
                .unwrap()
                .lock()
                .unwrap()
                .left(Instant::now())
                > 11.9
        );
    }

    #[test]
    fn keys_are_found_by_digest_and_unknown_keys_are_unauthorized() {
        use crate::error::EngineError;
        let tenants = Tenants::new(&[cfg("a", "key-a"), cfg("b", "key-b")]);
        assert_eq!(&*tenants.lookup("key-b").unwrap().id.0, "b");
        assert!(tenants.lookup("key-c").is_none());
        let now = std::time::Instant::now();
        for bad in [None, Some(""), Some("key-c"), Some("key-a ")] {
            let e = crate::tenancy::identify(&tenants, bad, now).unwrap_err();
            assert!(matches!(e, EngineError::Unauthorized(_)), "{bad:?}");
        }
        let a = crate::tenancy::identify(&tenants, Some("key-a"), now)
            .unwrap()
            .unwrap();
        assert!(a.may_use("classify") && !a.may_use("generate"));
        // Its rate: 1/s, burst 1 — the second request at once is refused with a wait of a second.
        let e = crate::tenancy::identify(&tenants, Some("key-a"), now).unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::RateLimited {
                    retry_after_s: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        // The other tenant has its own bucket.
        assert!(crate::tenancy::identify(&tenants, Some("key-b"), now).is_ok());
        // No tenants: open.
        assert!(crate::tenancy::identify(&Tenants::default(), None, now)
            .unwrap()
            .is_none());
    }
}
