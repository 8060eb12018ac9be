//! Per-request outcomes, channels, HDR histograms and the per-second series.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
pub use tiergate_core::outcome::Channel as Served;

/// One finished request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    /// Intended send time, seconds from the start of the run.
    pub at_s: f64,
    /// End to end, from the intended send time, microseconds.
    pub latency_us: u64,
    /// Time to first token from the intended send time (for JSON answers: the whole answer).
    pub ttft_us: Option<u64>,
    /// A generating stream's decode rate (tokens after the first ÷ time since the first), tokens/s; `None`
    /// for a label or JSON answer.
    pub decode_tps: Option<f32>,
    /// How late the client actually sent it, microseconds.
    pub lag_us: u64,
    pub status: u16,
    pub error: Option<&'static str>,
    pub tier: Option<&'static str>,
    pub degraded: Option<&'static str>,
    /// The answer was the route's out-of-scope outcome (`x-tiergate-out-of-scope: 1`).
    pub out_of_scope: bool,
    pub tokens_out: u32,
    /// `None` when the request had no label (or the route does not answer with labels).
    pub correct: Option<bool>,
    /// Time the server spent in models (`Server-Timing: model;dur=`), microseconds (u32: 71 minutes).
    pub model_us: Option<u32>,
    /// The latency-injection variant the server assigned (`x-tiergate-variant`).
    pub variant: Option<&'static str>,
    /// The budget it was sent with (`--deadline-ms`), milliseconds.
    pub budget_ms: Option<u32>,
    /// The cascade stage (LLM backend) that answered (`x-tiergate-stage`).
    pub stage: Option<&'static str>,
    /// The head that classified it (`x-tiergate-head-version`).
    pub head: Option<&'static str>,
}

/// Most distinct strings [`intern`] keeps; past it, new values read `other` (a server sending a new tier or
/// error name on every response cannot grow the bench's memory).
const INTERN_MAX: usize = 1024;

/// A `'static` copy of a short label (tier, degraded reason, error type), made once per distinct value, so a
/// stored outcome owns no heap memory (~100 bytes per request in all).
pub fn intern(s: &str) -> &'static str {
    use std::collections::HashSet;
    // tiergate's own values skip the shared table (this runs once or twice per response).
    use tiergate_core::outcome::{DegradeReason, Tier};
    let known = Tier::ALL
        .iter()
        .map(|t| t.as_str())
        .chain(DegradeReason::ALL.iter().map(|r| r.as_str()));
    if let Some(k) = known.into_iter().find(|k| *k == s) {
        return k;
    }
    use std::sync::{Mutex, OnceLock};
    static TABLE: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let Ok(mut t) = TABLE.get_or_init(|| Mutex::new(HashSet::new())).lock() else {
        return "other";
    };
    if let Some(&v) = t.get(s) {
        return v;
    }
    if t.len() >= INTERN_MAX {
        return "other";
    }
    let v: &'static str = Box::leak(s.to_string().into_boxed_str());
    t.insert(v);
    v
}

/// Where an answer went: one of the server's channels (tiergate's own type, as its metrics and console
/// count them), or the client's two: a 2xx answer without tiergate's tier header (another server), and no
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Channel {
    Served(Served),
    /// A 2xx answer without tiergate's tier header (another server).
    Untiered,
    /// No answer.
    Errors,
}

impl Channel {
    pub const ALL: [Channel; 7] = [
        Channel::Served(Served::Tier0),
        Channel::Served(Served::Escalated),
        Channel::Served(Served::Degraded),
        Channel::Served(Served::OutOfScope),
        Channel::Served(Served::Cache),
        Channel::Untiered,
        Channel::Errors,
    ];

    /// The server's channels (tiergate's names), then the client's own two.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Served(c) => c.as_str(),
            Channel::Untiered => "untiered",
            Channel::Errors => "errors",
        }
    }

    /// The channel of a response, from tiergate's headers: the server's own rule ([`Served::of`]) on its
    /// tier (a tier this client does not know counts as the LLM's), its degrade mark and its out-of-scope
    /// mark.
    pub fn of(o: &Outcome) -> Channel {
        use tiergate_core::outcome::Tier;
        if o.error.is_some() {
            return Channel::Errors;
        }
        let tier = match o.tier.map(Tier::parse) {
            Some(Some(t)) => t,
            Some(None) => Tier::Llm,
            None if o.degraded.is_some() => Tier::Tier0,
            None => return Channel::Untiered,
        };
        Channel::Served(Served::of(tier, o.degraded.is_some(), o.out_of_scope))
    }
}

impl Serialize for Channel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

pub use tiergate_core::bands::band;

/// Milliseconds with sensible precision.
pub fn ms(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.2}")
    } else if x < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// Percentiles of a set of microsecond values, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

/// An HDR histogram over 1 µs … 1 h at 3 significant digits.
pub fn histogram(values: impl Iterator<Item = u64>) -> Histogram<u64> {
    #[allow(clippy::expect_used)] // constant, valid bounds
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    for v in values {
        h.saturating_record(v.max(1));
    }
    h
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1e3;
        Some(Self {
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            mean_ms: h.mean() / 1e3,
            max_ms: h.max() as f64 / 1e3,
        })
    }
}

/// Per-stream decode rates of a channel's generating answers (label and JSON answers left out), tokens/s.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeRates {
    pub streams: u64,
    pub p50: f64,
    /// The slowest 5 % of streams decode at this rate or below.
    pub p5: f64,
    pub mean: f64,
}

impl DecodeRates {
    pub fn of(rates: impl Iterator<Item = f32>) -> Option<Self> {
        let mut v: Vec<f64> = rates.map(f64::from).filter(|r| r.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Self {
            streams: v.len() as u64,
            p50: at(0.50),
            p5: at(0.05),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }
}

/// Everything reported for one channel (or for all served requests).
#[derive(Debug, Clone, Serialize)]
pub struct ChannelStats {
    pub channel: String,
    pub count: u64,
    /// Of all requests sent.
    pub share: f64,
    pub latency: Option<Percentiles>,
    pub ttft: Option<Percentiles>,
    /// Model time per request (`Server-Timing: model;dur=`), where the server reported it.
    pub model: Option<Percentiles>,
    /// End to end minus model time per request: the serving overhead (network, queueing, HTTP, routing).
    pub overhead: Option<Percentiles>,
    pub requests_per_s: f64,
    /// Aggregate: every output token of the channel ÷ the run's time.
    pub tokens_per_s: f64,
    /// Per stream, generating answers only.
    pub decode: Option<DecodeRates>,
    pub tokens_out: u64,
    pub errors: BTreeMap<String, u64>,
    pub labelled: u64,
    pub correct: u64,
    pub accuracy: Option<f64>,
    /// The latency band of the P95.
    pub band: Option<&'static str>,
    /// The CDF for the charts: (latency ms, fraction ≤).
    #[serde(skip)]
    pub cdf: Vec<(f64, f64)>,
}

impl ChannelStats {
    pub fn of<'a>(
        name: &str,
        outcomes: impl Iterator<Item = &'a Outcome> + Clone,
        total: u64,
        elapsed_s: f64,
    ) -> Self {
        let lat = histogram(outcomes.clone().map(|o| o.latency_us));
        let ttft = histogram(outcomes.clone().filter_map(|o| o.ttft_us));
        let model = histogram(outcomes.clone().filter_map(|o| o.model_us.map(u64::from)));
        let overhead = histogram(
            outcomes
                .clone()
                .filter_map(|o| Some(o.latency_us.saturating_sub(u64::from(o.model_us?)))),
        );
        let count = lat.len();
        let tokens_out: u64 = outcomes.clone().map(|o| u64::from(o.tokens_out)).sum();
        let mut errors = BTreeMap::new();
        for e in outcomes.clone().filter_map(|o| o.error) {
            *errors.entry(e.to_string()).or_insert(0) += 1;
        }
        let labelled = outcomes.clone().filter(|o| o.correct.is_some()).count() as u64;
        let correct = outcomes.clone().filter(|o| o.correct == Some(true)).count() as u64;
        let latency = Percentiles::of(&lat);
        let cdf = if lat.is_empty() {
            Vec::new()
        } else {
            lat.iter_recorded()
                .map(|v| (v.value_iterated_to() as f64 / 1e3, v.quantile_iterated_to()))
                .collect()
        };
        let elapsed = elapsed_s.max(1e-9);
        Self {
            channel: name.to_string(),
            count,
            share: if total == 0 {
                0.0
            } else {
                count as f64 / total as f64
            },
            band: latency.as_ref().map(|l| band(l.p95_ms)),
            latency,
            ttft: Percentiles::of(&ttft),
            model: Percentiles::of(&model),
            overhead: Percentiles::of(&overhead),
            requests_per_s: count as f64 / elapsed,
            tokens_per_s: tokens_out as f64 / elapsed,
            decode: DecodeRates::of(outcomes.clone().filter_map(|o| o.decode_tps)),
            tokens_out,
            errors,
            labelled,
            correct,
            accuracy: (labelled > 0).then(|| correct as f64 / labelled as f64),
            cdf,
        }
    }
}

/// One second of the run (by intended send time).
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    pub t: u64,
    /// Requests sent in this second, by channel name.
    pub count: BTreeMap<&'static str, u64>,
    /// p50 and p99 latency (ms) by channel name.
    pub p50_ms: BTreeMap<&'static str, f64>,
    pub p99_ms: BTreeMap<&'static str, f64>,
    /// (escalated + degraded) / served.
    pub escalated_share: Option<f64>,
}

/// The per-second series.
pub fn series(outcomes: &[Outcome]) -> Vec<Second> {
    let secs = outcomes
        .iter()
        .map(|o| o.at_s.max(0.0) as u64)
        .max()
        .map_or(0, |m| m + 1);
    let mut buckets: Vec<Vec<&Outcome>> = vec![Vec::new(); secs as usize];
    for o in outcomes {
        buckets[o.at_s.max(0.0) as usize].push(o);
    }
    buckets
        .iter()
        .enumerate()
        .map(|(t, os)| {
            let mut s = Second {
                t: t as u64,
                count: BTreeMap::new(),
                p50_ms: BTreeMap::new(),
                p99_ms: BTreeMap::new(),
                escalated_share: None,
            };
            for ch in Channel::ALL {
                let mut v: Vec<u64> = os
                    .iter()
                    .filter(|o| Channel::of(o) == ch)
                    .map(|o| o.latency_us)
                    .collect();
                if v.is_empty() {
                    continue;
                }
                v.sort_unstable();
                let q = |x: f64| v[tiergate_core::stats::rank_index(v.len(), x)] as f64 / 1e3;
                s.count.insert(ch.name(), v.len() as u64);
                s.p50_ms.insert(ch.name(), q(0.5));
                s.p99_ms.insert(ch.name(), q(0.99));
            }
            let served = os.iter().filter(|o| o.error.is_none()).count();
            let esc = os
                .iter()
                .filter(|o| {
                    matches!(
                        Channel::of(o),
                        Channel::Served(Served::Escalated) | Channel::Served(Served::Degraded)
                    )
                })
                .count();
            if served > 0 {
                s.escalated_share = Some(esc as f64 / served as f64);
            }
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(at: f64, ms: u64, tier: Option<&str>, degraded: bool, error: bool) -> Outcome {
        Outcome {
            at_s: at,
            latency_us: ms * 1000,
            ttft_us: Some(ms * 500),
            lag_us: 0,
            status: if error { 429 } else { 200 },
            error: error.then_some("rate_limit"),
            tier: tier.map(intern),
            degraded: degraded.then_some("queue_full"),
            tokens_out: 2,
            correct: Some(ms < 50),
            ..Outcome::default()
        }
    }

    #[test]
    fn interning_is_stable_and_bounded() {
        let a = intern("tier0");
        assert!(std::ptr::eq(a, intern(&String::from("tier0"))));
        for i in 0..INTERN_MAX + 10 {
            intern(&format!("t{i}"));
        }
        assert_eq!(intern("never-seen-before"), "other");
        assert_eq!(intern("tier0"), "tier0");
        // What the bench keeps per request (96 bytes before model time, the experiment's variant, the
        // budget, the stage, the head and the decode rate).
        assert!(
            std::mem::size_of::<Outcome>() <= 168,
            "{}",
            std::mem::size_of::<Outcome>()
        );
    }

    #[test]
    fn channels_from_headers() {
        assert_eq!(
            Channel::of(&o(0.0, 1, Some("tier0"), false, false)),
            Channel::Served(Served::Tier0)
        );
        assert_eq!(
            Channel::of(&o(0.0, 1, Some("llm"), false, false)),
            Channel::Served(Served::Escalated)
        );
        assert_eq!(
            Channel::of(&o(0.0, 1, Some("tier0"), true, false)),
            Channel::Served(Served::Degraded)
        );
        assert_eq!(
            Channel::of(&o(0.0, 1, None, false, false)),
            Channel::Untiered
        );
        let oos = |tier: &str| Outcome {
            out_of_scope: true,
            ..o(0.0, 1, Some(tier), false, false)
        };
        assert_eq!(
            Channel::of(&oos("tier0")),
            Channel::Served(Served::OutOfScope)
        );
        // The LLM's "none of these" is an escalation.
        assert_eq!(Channel::of(&oos("llm")), Channel::Served(Served::Escalated));
        assert_eq!(Channel::Served(Served::OutOfScope).name(), "out_of_scope");
        assert_eq!(
            Channel::of(&o(0.0, 1, Some("tier0"), false, true)),
            Channel::Errors
        );
    }

    #[test]
    fn channel_stats_percentiles_accuracy_errors() {
        let os: Vec<Outcome> = (1..=100)
            .map(|i| o(0.5, i, Some("tier0"), false, i > 98))
            .collect();
        let s = ChannelStats::of("all", os.iter(), 200, 2.0);
        assert_eq!(s.count, 100);
        assert!((s.share - 0.5).abs() < 1e-9);
        let l = s.latency.clone().unwrap();
        assert!((l.p50_ms - 50.0).abs() < 0.1, "{l:?}");
        assert!((l.p99_ms - 99.0).abs() < 0.1, "{l:?}");
        assert!((l.mean_ms - 50.5).abs() < 0.1);
        assert_eq!(s.errors.get("rate_limit"), Some(&2));
        assert_eq!(s.correct, 49);
        assert_eq!(s.accuracy, Some(0.49));
        assert!((s.requests_per_s - 50.0).abs() < 1e-9);
        assert!((s.tokens_per_s - 100.0).abs() < 1e-9);
        // P95 of 1..=100 ms is 95 ms: past the 80 ms of Tier-0.
        assert_eq!(s.band, Some("Tier-1"));
        assert!((s.cdf.last().unwrap().1 - 1.0).abs() < 1e-9);
        let empty = ChannelStats::of("none", os.iter().take(0), 10, 1.0);
        assert!(empty.latency.is_none() && empty.band.is_none() && empty.accuracy.is_none());
    }

    #[test]
    fn per_second_series() {
        let os = vec![
            o(0.1, 10, Some("tier0"), false, false),
            o(0.2, 30, Some("llm"), false, false),
            o(2.5, 10, Some("tier0"), true, false),
            o(2.6, 10, Some("tier0"), false, true),
        ];
        let s = series(&os);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].count["tier0"], 1);
        assert_eq!(s[0].escalated_share, Some(0.5));
        assert!(s[1].count.is_empty() && s[1].escalated_share.is_none());
        assert_eq!(s[2].escalated_share, Some(1.0));
        assert_eq!(s[2].p99_ms["degraded"], 10.0);
    }
}
