//! The store: exact entries by key, least recently used first out when the byte bound is reached, each
//! expiring after the TTL; and for the semantic lookup, buckets of unit embeddings (one bucket per fingerprint
//! and Tier-0 top label, at most `bucket_cap` entries — the oldest leaves a full bucket), scanned whole.
//! A semantic entry is the same entry seen another way: it leaves its bucket when it leaves the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guards::{Features, Guards, Refusal};

/// The store's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes held at most (keys, values, embeddings and features, with a fixed overhead per entry).
    pub max_bytes: usize,
    /// An entry is not served after this long.
    pub ttl: Duration,
    /// Entries per semantic bucket at most.
    pub bucket_cap: usize,
    /// A semantic hit's cosine at least.
    pub tau: f32,
}

/// A value's size, for the byte bound.
pub trait Weighed {
    fn bytes(&self) -> usize;
}

/// How a lookup found its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    Exact,
    Semantic,
}

impl HitKind {
    /// The `x-tiergate-cache` value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HitKind::Exact => "exact",
            HitKind::Semantic => "semantic",
        }
    }
}

/// A found value.
#[derive(Debug, Clone)]
pub struct Hit<V> {
    pub value: Arc<V>,
    pub kind: HitKind,
    /// The cosine to the cached query (1 for an exact hit).
    pub similarity: f32,
}

/// What a semantic lookup found: a hit, and the guard that refused the nearest entry above τ when one did.
#[derive(Debug)]
pub struct Semantic<V> {
    pub hit: Option<Hit<V>>,
    pub refused: Option<Refusal>,
}

/// A semantic query: its bucket, unit embedding and features.
pub struct Query<'a> {
    pub bucket: u64,
    pub embedding: &'a [f32],
    pub features: &'a Features,
}

/// Overhead counted per entry beside its key, value and embedding (map slots, the LRU index, the bucket's
/// bookkeeping).
const ENTRY_OVERHEAD: usize = 160;

struct Entry<V> {
    value: Arc<V>,
    expires: Instant,
    tick: u64,
    bytes: usize,
    bucket: Option<u64>,
}

struct Bucket<V> {
    dim: usize,
    keys: Vec<Arc<str>>,
    /// `keys.len()` unit vectors of `dim`, one after the other, quantised to int8 (a scan reads a quarter of
    /// the bytes: at 100k entries a lookup is bound by memory, not arithmetic).
    codes: Vec<i8>,
    /// Each vector's scale: component ≈ code × scale.
    scales: Vec<f32>,
    features: Vec<Features>,
    values: Vec<Arc<V>>,
    expires: Vec<Instant>,
    /// Insertion order (the oldest leaves a full bucket).
    seq: Vec<u64>,
}

impl<V> Bucket<V> {
    fn new(dim: usize) -> Self {
        Self {
            dim,
            keys: Vec::new(),
            codes: Vec::new(),
            scales: Vec::new(),
            features: Vec::new(),
            values: Vec::new(),
            expires: Vec::new(),
            seq: Vec::new(),
        }
    }

    fn remove_at(&mut self, i: usize) {
        let d = self.dim;
        let last = self.keys.len() - 1;
        if i != last {
            self.codes.copy_within(last * d..(last + 1) * d, i * d);
        }
        self.codes.truncate(last * d);
        self.scales.swap_remove(i);
        self.keys.swap_remove(i);
        self.features.swap_remove(i);
        self.values.swap_remove(i);
        self.expires.swap_remove(i);
        self.seq.swap_remove(i);
    }

    fn position(&self, key: &Arc<str>) -> Option<usize> {
        self.keys.iter().position(|k| Arc::ptr_eq(k, key))
    }
}

/// The cache's state.
pub struct Store<V> {
    limits: Limits,
    entries: HashMap<Arc<str>, Entry<V>>,
    lru: BTreeMap<u64, Arc<str>>,
    buckets: HashMap<u64, Bucket<V>>,
    tick: u64,
    bytes: usize,
}

impl<V: Weighed> Store<V> {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            buckets: HashMap::new(),
            tick: 0,
            bytes: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held (as the bound counts them).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.lru.clear();
        self.buckets.clear();
        self.bytes = 0;
    }

    /// The value stored under `key`, unless it expired (then it is dropped).
    pub fn exact(&mut self, key: &str, now: Instant) -> Option<Hit<V>> {
        let (k, expires) = self
            .entries
            .get_key_value(key)
            .map(|(k, e)| (k.clone(), e.expires))?;
        if now >= expires {
            self.remove(&k);
            return None;
        }
        let value = self.touch(&k)?;
        Some(Hit {
            value,
            kind: HitKind::Exact,
            similarity: 1.0,
        })
    }

    /// The nearest entry of `q`'s bucket at cosine ≥ τ whose query the guards let answer `q`.
    pub fn semantic(&mut self, q: &Query<'_>, guards: &Guards, now: Instant) -> Semantic<V> {
        let mut out = Semantic {
            hit: None,
            refused: None,
        };
        let Some(b) = self.buckets.get(&q.bucket) else {
            return out;
        };
        if b.dim != q.embedding.len() || b.dim == 0 {
            return out;
        }
        // Stored vectors are unit: the cosine is the dot product over the query's norm.
        let norm = dot(q.embedding, q.embedding).sqrt();
        if norm <= 0.0 {
            return out;
        }
        let mut above: Vec<(f32, usize)> = b
            .codes
            .chunks_exact(b.dim)
            .enumerate()
            .filter(|(i, _)| b.expires[*i] > now)
            .map(|(i, e)| (dot_i8(e, q.embedding) * b.scales[i] / norm, i))
            .filter(|(s, _)| *s >= self.limits.tau)
            .collect();
        above.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (similarity, i) in above {
            match guards.agree(&b.features[i], q.features) {
                Ok(()) => {
                    let key = b.keys[i].clone();
                    out.hit = self.touch(&key).map(|value| Hit {
                        value,
                        kind: HitKind::Semantic,
                        similarity,
                    });
                    return out;
                }
                Err(r) => {
                    out.refused.get_or_insert(r);
                }
            }
        }
        out
    }

    /// Stores `value` under `key` (replacing what was there), and in `semantic`'s bucket when given (its
    /// embedding normalised here); evicts least recently used entries to stay within the byte bound. A value
    /// larger than the bound alone is not stored.
    pub fn insert(
        &mut self,
        key: &str,
        value: V,
        semantic: Option<(u64, Vec<f32>, Features)>,
        now: Instant,
    ) {
        self.remove(key);
        let semantic = semantic.filter(|(_, e, _)| !e.is_empty());
        let bytes = ENTRY_OVERHEAD
            + key.len()
            + value.bytes()
            + semantic
                .as_ref()
                .map_or(0, |(_, e, f)| e.len() + 4 + f.bytes());
        if bytes > self.limits.max_bytes {
            return;
        }
        while self.bytes + bytes > self.limits.max_bytes {
            let Some((_, oldest)) = self.lru.pop_first() else {
                break;
            };
            self.remove(&oldest);
        }
        let key: Arc<str> = Arc::from(key);
        let value = Arc::new(value);
        let expires = now + self.limits.ttl;
        self.tick += 1;
        let bucket = semantic.map(|(id, mut e, f)| {
            unit(&mut e);
            self.add_to_bucket(id, &key, e, f, &value, expires);
            id
        });
        self.lru.insert(self.tick, key.clone());
        self.entries.insert(
            key,
            Entry {
                value,
                expires,
                tick: self.tick,
                bytes,
                bucket,
            },
        );
        self.bytes += bytes;
    }

    fn add_to_bucket(
        &mut self,
        id: u64,
        key: &Arc<str>,
        e: Vec<f32>,
        f: Features,
        value: &Arc<V>,
        expires: Instant,
    ) {
        let cap = self.limits.bucket_cap;
        let b = self
            .buckets
            .entry(id)
            .or_insert_with(|| Bucket::new(e.len()));
        if b.dim != e.len() || cap == 0 {
            return;
        }
        if b.keys.len() >= cap {
            if let Some(oldest) = (0..b.seq.len()).min_by_key(|i| b.seq[*i]) {
                b.remove_at(oldest);
            }
        }
        b.keys.push(key.clone());
        let scale = e.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        b.codes.extend(
            e.iter()
                .map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8),
        );
        b.scales.push(scale);
        b.features.push(f);
        b.values.push(value.clone());
        b.expires.push(expires);
        b.seq.push(self.tick);
    }

    /// Marks `key` used now; its value.
    fn touch(&mut self, key: &Arc<str>) -> Option<Arc<V>> {
        self.tick += 1;
        let e = self.entries.get_mut(key)?;
        self.lru.remove(&e.tick);
        e.tick = self.tick;
        self.lru.insert(self.tick, key.clone());
        Some(e.value.clone())
    }

    fn remove(&mut self, key: &str) {
        let Some((k, e)) = self.entries.remove_entry(key) else {
            return;
        };
        self.lru.remove(&e.tick);
        self.bytes -= e.bytes;
        if let Some(b) = e.bucket.and_then(|id| self.buckets.get_mut(&id)) {
            if let Some(i) = b.position(&k) {
                b.remove_at(i);
            }
        }
    }
}

/// Scales `v` to unit length (a zero vector stays zero and matches nothing).
pub fn unit(v: &mut [f32]) {
    let n = dot(v, v).sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// The dot product: in 16 lanes, compiled for AVX-512 or AVX2 + FMA where the CPU has them (the build's
/// baseline is SSE2), else for the baseline.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            return unsafe { dot_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

/// Σ codes[i] × q[i], dispatched like [`dot`].
pub fn dot_i8(codes: &[i8], q: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            return unsafe { dot_i8_avx512(codes, q) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { dot_i8_avx2(codes, q) };
        }
    }
    dot_i8_lanes(codes, q)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_i8_avx512(codes: &[i8], q: &[f32]) -> f32 {
    dot_i8_lanes(codes, q)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_i8_avx2(codes: &[i8], q: &[f32]) -> f32 {
    dot_i8_lanes(codes, q)
}

#[inline(always)]
fn dot_i8_lanes(codes: &[i8], q: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cq) = (codes.chunks_exact(16), q.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cq.remainder())
        .map(|(c, y)| f32::from(*c) * y)
        .sum();
    for (c, y) in ca.zip(cq) {
        for l in 0..16 {
            acc[l] = f32::from(c[l]).mul_add(y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guards::GuardWords;

    #[derive(Debug, PartialEq)]
    struct V(String);
    impl Weighed for V {
        fn bytes(&self) -> usize {
            self.0.len()
        }
    }

    fn limits(max_bytes: usize) -> Limits {
        Limits {
            max_bytes,
            ttl: Duration::from_secs(60),
            bucket_cap: 3,
            tau: 0.9,
        }
    }

    fn guards() -> Guards {
        Guards::new(&GuardWords::english().expect("parses")).expect("compiles")
    }

    #[test]
    fn an_entry_expires_after_the_ttl() {
        let mut s = Store::new(limits(1 << 20));
        let t = Instant::now();
        s.insert("k", V("v".into()), None, t);
        assert!(s.exact("k", t + Duration::from_secs(59)).is_some());
        assert!(s.exact("k", t + Duration::from_secs(60)).is_none());
        assert!(s.is_empty(), "an expired entry is dropped when found");
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn the_byte_bound_evicts_the_least_recently_used() {
        let per = ENTRY_OVERHEAD + 2 + 10;
        let mut s = Store::new(limits(3 * per));
        let t = Instant::now();
        for k in ["k1", "k2", "k3"] {
            s.insert(k, V("x".repeat(10)), None, t);
        }
        assert_eq!(s.bytes(), 3 * per);
        assert!(s.exact("k1", t).is_some(), "k1 used: k2 is now the oldest");
        s.insert("k4", V("x".repeat(10)), None, t);
        assert_eq!(s.len(), 3);
        assert!(s.exact("k2", t).is_none());
        for k in ["k1", "k3", "k4"] {
            assert!(s.exact(k, t).is_some(), "{k} kept");
        }
        assert!(s.bytes() <= 3 * per);
        // Larger than the whole bound: not stored, nothing evicted for it.
        s.insert("big", V("x".repeat(4 * per)), None, t);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn semantic_hits_stay_in_their_bucket_above_tau_and_pass_the_guards() {
        let g = guards();
        let mut s = Store::new(limits(1 << 20));
        let t = Instant::now();
        let text = "my card has not arrived";
        s.insert(
            "a",
            V("card_not_arrived".into()),
            Some((7, vec![1.0, 0.0, 0.0], g.features(text))),
            t,
        );
        let near = [0.95f32, 0.3122, 0.0];
        let ask = |s: &mut Store<V>, bucket, text: &str, e: &[f32]| {
            let f = g.features(text);
            s.semantic(
                &Query {
                    bucket,
                    embedding: e,
                    features: &f,
                },
                &g,
                t,
            )
        };
        // The query need not be unit: its cosine is what counts.
        let scaled: Vec<f32> = near.iter().map(|x| x * 3.0).collect();
        let hit = ask(&mut s, 7, "my card still has not come", &scaled);
        let hit = hit.hit.expect("near, same bucket, guards agree");
        assert_eq!(hit.kind, HitKind::Semantic);
        assert!((hit.similarity - 0.95).abs() < 1e-3);
        assert!(ask(&mut s, 8, "my card still has not come", &near)
            .hit
            .is_none());
        let far = [0.5f32, 0.866, 0.0];
        assert!(ask(&mut s, 7, "my card still has not come", &far)
            .hit
            .is_none());
        let negated = ask(&mut s, 7, "my card has arrived", &near);
        assert!(negated.hit.is_none());
        assert_eq!(negated.refused, Some(Refusal::Negation));
    }

    #[test]
    fn a_full_bucket_drops_its_oldest_and_an_evicted_entry_leaves_its_bucket() {
        let g = guards();
        let mut s = Store::new(limits(1 << 20));
        let t = Instant::now();
        for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
            let mut e = vec![0.0; 4];
            e[i] = 1.0;
            s.insert(k, V((*k).into()), Some((1, e, g.features(""))), t);
        }
        let f = g.features("");
        let q = |e: [f32; 4]| e.to_vec();
        let find = |s: &mut Store<V>, e: Vec<f32>| {
            s.semantic(
                &Query {
                    bucket: 1,
                    embedding: &e,
                    features: &f,
                },
                &g,
                t,
            )
            .hit
            .map(|h| h.value.0.clone())
        };
        assert_eq!(
            find(&mut s, q([1.0, 0.0, 0.0, 0.0])),
            None,
            "a left the full bucket"
        );
        assert!(s.exact("a", t).is_some(), "but is still an exact entry");
        assert_eq!(find(&mut s, q([0.0, 0.0, 0.0, 1.0])), Some("d".into()));
        s.clear();
        assert_eq!(find(&mut s, q([0.0, 0.0, 0.0, 1.0])), None);
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn int8_cosines_are_within_a_few_thousandths_of_f32() {
        let g = guards();
        let t = Instant::now();
        let f = g.features("");
        let mut worst = 0f32;
        for k in 0..200u64 {
            let a: Vec<f32> = (0..384)
                .map(|i| ((i as f32 + k as f32) * 0.37).sin())
                .collect();
            let b: Vec<f32> = (0..384)
                .map(|i| ((i as f32 + k as f32) * 0.37).sin() + 0.3 * ((i * 7) as f32).cos())
                .collect();
            let mut s1 = Store::new(Limits {
                tau: -1.0,
                ..limits(1 << 24)
            });
            s1.insert("x", V(String::new()), Some((1, a.clone(), f.clone())), t);
            let got = s1
                .semantic(
                    &Query {
                        bucket: 1,
                        embedding: &b,
                        features: &f,
                    },
                    &g,
                    t,
                )
                .hit
                .expect("τ = -1 takes anything")
                .similarity;
            let want = dot(&a, &b) / (dot(&a, &a) * dot(&b, &b)).sqrt();
            worst = worst.max((got - want).abs());
        }
        assert!(worst < 3e-3, "int8 cosine off by {worst}");
    }

    #[test]
    fn dot_matches_the_plain_sum() {
        let a: Vec<f32> = (0..384).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..384).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-3);
    }
}
