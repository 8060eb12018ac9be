//! The answer cache measured offline, on Tier-0's real embeddings and the cache's real store and guards:
//! - [`pairs`]: the adversarial set (`bench/workloads/cache_pairs.jsonl`): for each τ, the share of
//!   paraphrases that hit and the pairs that must not hit but do, by kind, with and without the guards; τ is
//!   chosen on the `tune` half and the figures reported on the `report` half.
//! - [`replay`]: labelled rows asked again and again with a Zipf repetition profile: LLM jobs saved (hits),
//!   and false hits — a hit whose cached label differs from the fresh verdict. Offline there is no LLM: the
//!   fresh verdict is the gold label (a perfect judge), so a false hit is a neighbour of another label.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;
use tiergate_cache::{Guards, HitKind, Limits, Query, Store, Weighed};

/// Tier-0's view of each of `texts` (its embedding kept), through the real batching runtime.
pub fn observe(
    mut classifier: tiergate_prefilter::Classifier,
    texts: &[String],
    cfg: &tiergate_config::PrefilterConfig,
) -> tiergate_prefilter::Result<Vec<Seen>> {
    classifier.keep_embeddings = true;
    let handle = tiergate_prefilter::PrefilterHandle::start(classifier, cfg)?;
    let rows: Vec<crate::data::Example> = texts
        .iter()
        .map(|t| crate::data::Example {
            text: t.clone(),
            label: String::new(),
        })
        .collect();
    let preds = crate::eval::predict_all(&handle, &rows, cfg)?;
    Ok(preds
        .into_iter()
        .zip(texts)
        .map(|(p, t)| Seen {
            text: t.clone(),
            top: p.label,
            ambiguity: 1.0 - f64::from(p.confidence),
            embedding: p.embedding,
        })
        .collect())
}

/// One query as Tier-0 saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub text: String,
    /// Tier-0's top label.
    pub top: usize,
    /// Its ambiguity, 1 − max p.
    pub ambiguity: f64,
    pub embedding: Vec<f32>,
}

/// One pair of the adversarial set.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Pair {
    pub id: usize,
    pub kind: String,
    pub a: String,
    pub b: String,
    /// a's verdict may answer b.
    pub hit: bool,
    /// `tune` or `report`.
    pub half: String,
}

/// A pair's measurements: whether the two are one exact key, share Tier-0's top label, their cosine and the
/// guards' verdict.
#[derive(Debug, Clone)]
pub struct Measured {
    pub pair: Pair,
    pub exact: bool,
    pub same_bucket: bool,
    pub cosine: f32,
    pub guards_agree: bool,
}

/// Measures each pair from Tier-0's view of its two queries.
pub fn measure(pairs: &[Pair], a: &[Seen], b: &[Seen], guards: &Guards) -> Vec<Measured> {
    pairs
        .iter()
        .zip(a.iter().zip(b))
        .map(|(p, (x, y))| Measured {
            pair: p.clone(),
            exact: tiergate_cache::normalise(&x.text) == tiergate_cache::normalise(&y.text),
            same_bucket: x.top == y.top,
            cosine: cosine(&x.embedding, &y.embedding),
            guards_agree: guards
                .agree(&guards.features(&x.text), &guards.features(&y.text))
                .is_ok(),
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let d = tiergate_cache::store::dot(a, b);
    let n = (tiergate_cache::store::dot(a, a) * tiergate_cache::store::dot(b, b)).sqrt();
    if n > 0.0 {
        d / n
    } else {
        0.0
    }
}

/// Figures of one half at one τ, with or without the guards.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PairFigures {
    pub tau: f32,
    pub guards: bool,
    pub pairs: usize,
    pub paraphrases: usize,
    /// Paraphrases that hit.
    pub paraphrase_hits: usize,
    /// Pairs that must not hit and do, by kind.
    pub false_hits: Vec<(String, usize, usize)>,
    /// All hits, and the false ones among them.
    pub hits: usize,
    pub false_total: usize,
}

impl PairFigures {
    /// The paraphrase hit rate.
    pub fn hit_rate(&self) -> f64 {
        self.paraphrase_hits as f64 / self.paraphrases.max(1) as f64
    }

    /// False hits as a share of all hits.
    pub fn false_share(&self) -> f64 {
        self.false_total as f64 / self.hits.max(1) as f64
    }

    /// False hits on negation and number pairs.
    pub fn negation_number_false(&self) -> usize {
        self.false_hits
            .iter()
            .filter(|(k, _, _)| k == "negation" || k == "number")
            .map(|(_, f, _)| *f)
            .sum()
    }
}

/// Whether the cache would answer `m.b` with `m.a`'s verdict at `tau`.
pub fn hits(m: &Measured, tau: f32, guards: bool) -> bool {
    m.exact || (m.same_bucket && m.cosine >= tau && (!guards || m.guards_agree))
}

/// The figures of the pairs of `half` at `tau`.
pub fn figures(measured: &[Measured], half: &str, tau: f32, guards: bool) -> PairFigures {
    let rows: Vec<&Measured> = measured.iter().filter(|m| m.pair.half == half).collect();
    let mut kinds: Vec<String> = rows
        .iter()
        .filter(|m| !m.pair.hit)
        .map(|m| m.pair.kind.clone())
        .collect();
    kinds.sort();
    kinds.dedup();
    let false_hits = kinds
        .iter()
        .map(|k| {
            let of: Vec<&&Measured> = rows.iter().filter(|m| &m.pair.kind == k).collect();
            let f = of.iter().filter(|m| hits(m, tau, guards)).count();
            (k.clone(), f, of.len())
        })
        .collect::<Vec<_>>();
    let para: Vec<&&Measured> = rows.iter().filter(|m| m.pair.hit).collect();
    let paraphrase_hits = para.iter().filter(|m| hits(m, tau, guards)).count();
    let false_total = false_hits.iter().map(|(_, f, _)| f).sum();
    PairFigures {
        tau,
        guards,
        pairs: rows.len(),
        paraphrases: para.len(),
        paraphrase_hits,
        false_hits,
        hits: paraphrase_hits + false_total,
        false_total,
    }
}

/// τ chosen on the tune half: the lowest on the grid (the most hits) with no false hit on negation and
/// number pairs and false hits at most `max_false_share` of the hits.
pub fn choose_tau(measured: &[Measured], guards: bool, max_false_share: f64) -> Option<f32> {
    (50..=100).map(|i| i as f32 / 100.0).find(|&tau| {
        let f = figures(measured, "tune", tau, guards);
        f.negation_number_false() == 0 && f.false_share() <= max_false_share
    })
}

/// A cached label (the replay's value).
struct Label(usize);
impl Weighed for Label {
    fn bytes(&self) -> usize {
        8
    }
}

/// What a Zipf replay measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplayReport {
    pub requests: usize,
    pub distinct_rows: usize,
    pub zipf_s: f64,
    pub theta: f64,
    pub tau: f32,
    pub semantic: bool,
    /// Requests Tier-0 escalates at θ.
    pub escalated: usize,
    pub exact_hits: usize,
    pub semantic_hits: usize,
    /// Hits whose cached label differs from the fresh verdict (the gold label).
    pub false_hits: usize,
    /// Those among the semantic hits.
    pub semantic_false_hits: usize,
    /// LLM jobs run (escalations the cache did not answer).
    pub llm_jobs: usize,
    /// Accuracy on the escalated requests with a perfect judge: 1 without the cache; with it, 1 − false hits.
    pub escalated_accuracy_with_cache: f64,
    /// The slowest lookups over the replay, microseconds.
    pub lookup_p50_us: f64,
    pub lookup_p99_us: f64,
}

/// Replays `requests` draws over `seen` (with their gold labels) with a Zipf(`s`) repetition profile over a
/// seeded shuffle of the rows; escalates at `theta`; answers from a real [`Store`] (exact by normalised text,
/// semantic in the top-label bucket of at most `bucket_cap` entries at `tau` when `semantic`).
#[allow(clippy::too_many_arguments)]
pub fn replay(
    seen: &[Seen],
    gold: &[usize],
    guards: &Guards,
    requests: usize,
    s: f64,
    theta: f64,
    tau: f32,
    bucket_cap: usize,
    semantic: bool,
    seed: u64,
) -> ReplayReport {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..seen.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let weights: Vec<f64> = (1..=order.len()).map(|r| (r as f64).powf(-s)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut store: Store<Label> = Store::new(Limits {
        max_bytes: 1 << 30,
        ttl: Duration::from_secs(86_400),
        bucket_cap,
        tau,
    });
    let mut r = ReplayReport {
        requests,
        distinct_rows: 0,
        zipf_s: s,
        theta,
        tau,
        semantic,
        escalated: 0,
        exact_hits: 0,
        semantic_hits: 0,
        false_hits: 0,
        semantic_false_hits: 0,
        llm_jobs: 0,
        escalated_accuracy_with_cache: 1.0,
        lookup_p50_us: 0.0,
        lookup_p99_us: 0.0,
    };
    let mut asked = std::collections::HashSet::new();
    let mut lookups = Vec::new();
    let now = Instant::now();
    for _ in 0..requests {
        let u: f64 = rng.gen();
        let rank = cdf.partition_point(|c| *c < u).min(order.len() - 1);
        let i = order[rank];
        asked.insert(i);
        let q = &seen[i];
        if q.ambiguity <= theta {
            continue;
        }
        r.escalated += 1;
        let key = tiergate_cache::normalise(&q.text);
        let features = guards.features(&q.text);
        let t = Instant::now();
        let mut hit = store.exact(&key, now).map(|h| (h.value.0, HitKind::Exact));
        if hit.is_none() && semantic {
            let found = store.semantic(
                &Query {
                    bucket: q.top as u64,
                    embedding: &q.embedding,
                    features: &features,
                },
                guards,
                now,
            );
            hit = found.hit.map(|h| (h.value.0, HitKind::Semantic));
        }
        lookups.push(t.elapsed().as_secs_f64() * 1e6);
        match hit {
            Some((label, kind)) => {
                match kind {
                    HitKind::Exact => r.exact_hits += 1,
                    HitKind::Semantic => r.semantic_hits += 1,
                }
                if label != gold[i] {
                    r.false_hits += 1;
                    r.semantic_false_hits += usize::from(kind == HitKind::Semantic);
                }
            }
            None => {
                r.llm_jobs += 1;
                let sem = semantic.then(|| (q.top as u64, q.embedding.clone(), features));
                store.insert(&key, Label(gold[i]), sem, now);
            }
        }
    }
    r.distinct_rows = asked.len();
    r.escalated_accuracy_with_cache = 1.0 - r.false_hits as f64 / r.escalated.max(1) as f64;
    r.lookup_p50_us = tiergate_core::stats::quantile(lookups.clone(), 0.5).unwrap_or(0.0);
    r.lookup_p99_us = tiergate_core::stats::quantile(lookups, 0.99).unwrap_or(0.0);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guards() -> Guards {
        Guards::new(&tiergate_cache::GuardWords::english().expect("parses")).expect("compiles")
    }

    fn seen(text: &str, top: usize, e: Vec<f32>) -> Seen {
        Seen {
            text: text.into(),
            top,
            ambiguity: 0.9,
            embedding: e,
        }
    }

    #[test]
    fn a_pair_hits_on_one_bucket_above_tau_where_the_guards_agree() {
        let pair = |kind: &str, hit: bool| Pair {
            id: 0,
            kind: kind.into(),
            a: String::new(),
            b: String::new(),
            hit,
            half: "tune".into(),
        };
        let pairs = vec![pair("paraphrase", true), pair("negation", false)];
        let a = vec![
            seen("my card has arrived", 1, vec![1.0, 0.0]),
            seen("my card has arrived", 1, vec![1.0, 0.0]),
        ];
        let b = vec![
            seen("my card has come", 1, vec![0.96, 0.28]),
            seen("my card has not arrived", 1, vec![0.99, 0.14]),
        ];
        let m = measure(&pairs, &a, &b, &guards());
        assert!(hits(&m[0], 0.95, true) && !hits(&m[0], 0.97, true));
        assert!(!hits(&m[1], 0.95, true), "the negation guard refuses");
        assert!(hits(&m[1], 0.95, false), "without guards it would hit");
        let f = figures(&m, "tune", 0.95, false);
        assert_eq!(
            (f.paraphrase_hits, f.false_total, f.negation_number_false()),
            (1, 1, 1)
        );
        assert_eq!(choose_tau(&m, true, 0.0), Some(0.5));
        // Without guards the negation (0.99) is nearer than the paraphrase (0.96): only τ = 1 (exact hits)
        // keeps it out.
        assert_eq!(choose_tau(&m, false, 0.0), Some(1.0));
    }

    #[test]
    fn a_replay_hits_repeats_and_counts_a_neighbour_of_another_label_as_false() {
        let rows = vec![
            seen("card lost", 0, vec![1.0, 0.0]),
            seen("my card is lost", 0, vec![0.99, 0.1]),
            seen("card stolen", 0, vec![0.98, 0.2]),
        ];
        let gold = vec![0, 0, 1];
        let r = replay(&rows, &gold, &guards(), 500, 1.0, 0.5, 0.95, 256, true, 7);
        assert_eq!(r.escalated, 500);
        assert_eq!(
            r.llm_jobs, 1,
            "one fresh verdict; everything after is a hit"
        );
        assert_eq!(r.exact_hits + r.semantic_hits, 499);
        assert!(r.false_hits > 0, "card stolen takes card lost's verdict");
        let exact_only = replay(&rows, &gold, &guards(), 500, 1.0, 0.5, 0.95, 256, false, 7);
        assert_eq!((exact_only.llm_jobs, exact_only.false_hits), (3, 0));
    }
}
