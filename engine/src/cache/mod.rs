//! Tier −1 as the engine runs it: an LLM stage's verdict found again instead of computed. The key is the
//! stage's scope (a fingerprint of everything that makes a verdict valid, [`scope`]), the candidates it was
//! asked about and the normalised text; a miss there looks in the shared store (`kind = "redis"`), then —
//! with `semantic` — in the stage's bucket for Tier-0's top label ([`tiergate_cache`]). The store's lock is
//! never held across an await; the shared store fails open (a miss, never an error).

pub(crate) mod scope;
pub(crate) mod shared;
#[cfg(test)]
mod shared_tests;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tiergate_cache::{Features, Guards, Hit, HitKind, Limits, Query, Store, Weighed};
use tiergate_config::{CacheConfig, CacheKind};
use tiergate_core::fnv::Fnv;

use crate::metrics as m;

pub(crate) use scope::scope;

/// A stage's cached verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Verdict {
    /// The full key it was stored under (a shared entry is checked against it: its Redis key is a hash).
    pub key: String,
    /// The candidates the LLM scored (label indices; "none of these" is [`crate::model::out_of_scope::NONE`]).
    pub candidates: Vec<usize>,
    /// The LLM's score per candidate.
    pub scores: Vec<f32>,
    /// The stage's fused answer (label index, probability), most likely first.
    pub fused: Vec<(usize, f32)>,
    /// The backend that computed it.
    pub backend: String,
    /// When it was computed, Unix milliseconds.
    pub at_ms: u64,
    /// A written answer or generation: its text (a rerank verdict has none).
    #[serde(default)]
    pub text: Option<String>,
    /// A written answer's finish reason and completion tokens.
    #[serde(default)]
    pub finish_reason: String,
    #[serde(default)]
    pub completion_tokens: u32,
}

impl Weighed for Verdict {
    fn bytes(&self) -> usize {
        self.key.len()
            + self.backend.len()
            + self.candidates.len() * 8
            + self.scores.len() * 4
            + self.fused.len() * 16
            + self.text.as_ref().map_or(0, String::len)
            + self.finish_reason.len()
            + 64
    }
}

/// One lookup's question: its key, its semantic bucket, the query's embedding and what the guards read, and
/// the epochs it was asked under (a verdict is kept only while they are current: a clear in between drops it).
pub(crate) struct Probe {
    pub key: String,
    pub bucket: u64,
    pub embedding: Vec<f32>,
    pub features: Features,
    epoch: u64,
    shared_epoch: u64,
}

impl Probe {
    /// The shared store's epoch it was asked under ([`AnswerCache::share`] writes only while it is current).
    pub(crate) fn shared_epoch(&self) -> u64 {
        self.shared_epoch
    }
}

/// A found verdict, and how.
pub(crate) struct Found {
    pub verdict: std::sync::Arc<Verdict>,
    pub kind: HitKind,
    pub similarity: f32,
}

/// The cache.
/// How often a replica reads the shared store's epoch, so that a clear through another replica reaches it.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_millis(500);

pub(crate) struct AnswerCache {
    store: Mutex<Store<Verdict>>,
    guards: Guards,
    semantic: bool,
    shared: Option<shared::Shared>,
    /// This replica's clears so far: a probe from before one is not written after it.
    epoch: std::sync::atomic::AtomicU64,
    /// The shared epoch this replica's own entries belong to: once the shared store's moves past it (a clear
    /// through any replica), they are dropped.
    local_shared: std::sync::atomic::AtomicU64,
}

impl AnswerCache {
    /// The cache `[cache]` describes; `None` when it is off.
    pub(crate) fn new(cfg: &CacheConfig) -> anyhow::Result<Option<Self>> {
        if !cfg.enabled {
            return Ok(None);
        }
        let words = tiergate_cache::GuardWords::load(cfg.guards.as_deref())?;
        let shared = match cfg.kind {
            CacheKind::Memory => None,
            CacheKind::Redis => Some(shared::Shared::new(cfg)?),
        };
        Ok(Some(Self {
            store: Mutex::new(Store::new(Limits {
                max_bytes: usize::try_from(cfg.max_bytes).unwrap_or(usize::MAX),
                ttl: Duration::from_secs(cfg.ttl_s),
                bucket_cap: cfg.bucket_cap,
                tau: cfg.tau,
            })),
            guards: Guards::new(&words)?,
            semantic: cfg.semantic,
            shared,
            epoch: std::sync::atomic::AtomicU64::new(0),
            local_shared: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// What the guards' lists cover.
    pub(crate) fn covers(&self) -> &str {
        self.guards.covers()
    }

    /// The question for stage scope `scope`, `candidates` (in the order the LLM sees them), the query `text`,
    /// Tier-0's top label and the query's embedding (empty: exact lookups only).
    pub(crate) fn probe(
        &self,
        scope: u64,
        candidates: &[usize],
        text: &str,
        label: usize,
        embedding: &[f32],
    ) -> Probe {
        let list: Vec<String> = candidates.iter().map(|c| c.to_string()).collect();
        let key = format!(
            "{scope:016x}|{}|{}",
            list.join(","),
            tiergate_cache::normalise(text)
        );
        let bucket = Fnv::new()
            .eat(&scope.to_le_bytes())
            .eat(&(label as u64).to_le_bytes())
            .finish();
        Probe {
            key,
            bucket,
            embedding: if self.semantic {
                embedding.to_vec()
            } else {
                Vec::new()
            },
            features: self.guards.features(text),
            epoch: self.epoch(),
            shared_epoch: self.shared_epoch(),
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    fn shared_epoch(&self) -> u64 {
        self.shared.as_ref().map_or(0, shared::Shared::known_epoch)
    }

    /// The question for a written answer or generation: exact only, under `key` (the caller's fingerprint of
    /// the stage, the tenant, the whole job and its sampling).
    pub(crate) fn exact_probe(&self, key: String) -> Probe {
        Probe {
            key,
            bucket: 0,
            embedding: Vec::new(),
            features: Features::default(),
            epoch: self.epoch(),
            shared_epoch: self.shared_epoch(),
        }
    }

    /// The verdict for `p`: exact here, exact in the shared store, then semantic here.
    pub(crate) async fn lookup(&self, p: &Probe) -> Option<Found> {
        self.drop_if_cleared_elsewhere(self.shared_epoch());
        let now = Instant::now();
        if let Some(h) = self.with_store(|s| s.exact(&p.key, now)).flatten() {
            return Some(found(h));
        }
        if let Some(sh) = &self.shared {
            if let Some(v) = sh.get::<Verdict>(&p.key).await {
                // A shared verdict joins this replica's store, and its semantic index under this query.
                self.put(p, v.clone());
                return Some(Found {
                    verdict: std::sync::Arc::new(v),
                    kind: HitKind::Exact,
                    similarity: 1.0,
                });
            }
        }
        if p.embedding.is_empty() {
            return None;
        }
        let q = Query {
            bucket: p.bucket,
            embedding: &p.embedding,
            features: &p.features,
        };
        let looked = self.with_store(|s| s.semantic(&q, &self.guards, now))?;
        if let Some(r) = &looked.refused {
            metrics::counter!(m::CACHE_GUARD_REFUSALS_TOTAL, "guard" => r.as_str()).increment(1);
        }
        looked.hit.map(found)
    }

    /// Whether verdicts are also shared through Redis ([`AnswerCache::share`]).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Writes a fresh verdict to the shared store under the shared epoch its probe was asked under (bounded by
    /// its timeout; a failure, or a clear since, is a skipped write).
    pub(crate) async fn share(&self, key: &str, shared_epoch: u64, v: &Verdict) {
        if let Some(sh) = &self.shared {
            sh.set(key, shared_epoch, v).await;
        }
    }

    /// Stores a fresh verdict here (in its semantic bucket too, when the probe has an embedding), unless this
    /// replica's cache was cleared since the probe was made.
    pub(crate) fn put(&self, p: &Probe, v: Verdict) {
        if p.epoch != self.epoch() {
            return;
        }
        let semantic =
            (!p.embedding.is_empty()).then(|| (p.bucket, p.embedding.clone(), p.features.clone()));
        self.with_store(|s| {
            s.insert(&p.key, v, semantic, Instant::now());
            metrics::gauge!(m::CACHE_ENTRIES).set(s.len() as f64);
            metrics::gauge!(m::CACHE_BYTES).set(s.bytes() as f64);
        });
    }

    /// Drops every entry here (the epoch moves on first, so a verdict computed before is not kept after) and
    /// clears the shared store ([`shared::Shared::clear`]): (entries dropped here, the shared clear — `None`
    /// when there is no shared store, `Some(None)` when it did not answer).
    pub(crate) async fn clear(&self) -> (usize, Option<Option<shared::Cleared>>) {
        let here = self.drop_here();
        let there = match &self.shared {
            Some(sh) => Some(sh.clear().await),
            None => None,
        };
        (here, there)
    }

    /// Reads the shared store's epoch and drops this replica's entries when a clear through another replica
    /// moved it on (every [`FOLLOW_EVERY`], [`crate::tasks`]; a lookup that reads the shared store does it too).
    pub(crate) async fn follow_shared_clears(&self) {
        if let Some(sh) = &self.shared {
            let known = sh.follow_epoch().await;
            self.drop_if_cleared_elsewhere(known);
        }
    }

    /// Drops every entry here, the epoch moving on first (a verdict computed before is not kept after): how
    /// many there were.
    fn drop_here(&self) -> usize {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.with_store(|s| {
            let n = s.len();
            s.clear();
            metrics::gauge!(m::CACHE_ENTRIES).set(0.0);
            metrics::gauge!(m::CACHE_BYTES).set(0.0);
            n
        })
        .unwrap_or(0)
    }

    /// Drops the entries here when the shared epoch `known` is past the one they belong to.
    fn drop_if_cleared_elsewhere(&self, known: u64) {
        use std::sync::atomic::Ordering::AcqRel;
        let was = self.local_shared.fetch_max(known, AcqRel);
        if known <= was {
            return;
        }
        let n = self.drop_here();
        tracing::info!(
            epoch = known,
            dropped = n,
            "the shared answer cache was cleared: this replica's entries dropped"
        );
    }

    /// The last shared clear's removal of old keys (`None`: no shared store).
    pub(crate) fn removal(&self) -> Option<shared::Removal> {
        self.shared.as_ref().map(shared::Shared::removal)
    }

    /// Entries and bytes held here.
    pub(crate) fn size(&self) -> (usize, usize) {
        self.with_store(|s| (s.len(), s.bytes())).unwrap_or((0, 0))
    }

    /// Whether the shared store answered last time (`None`: there is none).
    pub(crate) fn shared_up(&self) -> Option<bool> {
        self.shared.as_ref().map(shared::Shared::is_up)
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut Store<Verdict>) -> T) -> Option<T> {
        self.store.lock().ok().map(|mut s| f(&mut s))
    }
}

impl shared::HasKey for Verdict {
    fn key(&self) -> &str {
        &self.key
    }
}

fn found(h: Hit<Verdict>) -> Found {
    Found {
        verdict: h.value,
        kind: h.kind,
        similarity: h.similarity,
    }
}
