//! Per-request budgets (`--deadline-ms`): each request carries `x-tiergate-deadline-ms`, fixed or drawn
//! uniformly from a range, and the report says which share of answers came within budget, per channel and per
//! budget range, and how the escalated share falls as budgets shrink.

use std::fmt::Write as _;

use serde::Serialize;

use crate::stats::{Channel, Outcome, Served};

/// `--deadline-ms`: `N` (every request) or `A-B` (uniform in [A, B]), milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeadlineSpec {
    pub min_ms: u32,
    pub max_ms: u32,
}

impl std::str::FromStr for DeadlineSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<u32>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    format!("--deadline-ms `{s}`: expected N or A-B, positive milliseconds")
                })
        };
        let (min_ms, max_ms) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if min_ms > max_ms {
            return Err(format!("--deadline-ms `{s}`: A must not exceed B"));
        }
        Ok(Self { min_ms, max_ms })
    }
}

impl DeadlineSpec {
    /// The budget of request `n` of a run seeded `seed` (deterministic).
    pub fn draw(&self, seed: u64, n: u64) -> u32 {
        if self.min_ms == self.max_ms {
            return self.min_ms;
        }
        // splitmix64 of (seed, n): uniform enough for a budget, and the same for the same run.
        let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let span = u64::from(self.max_ms - self.min_ms) + 1;
        self.min_ms + (z % span) as u32
    }
}

/// Budget ranges of the report, milliseconds (upper bounds; the last is open).
const EDGES: [u32; 4] = [500, 1000, 2000, 5000];

/// Answers within budget, per channel and per budget range.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineReport {
    /// Answers (errors included) that carried a budget.
    pub requests: u64,
    /// Share of them answered (without error) within their budget.
    pub within: f64,
    /// (channel, answers, share within budget).
    pub channels: Vec<(&'static str, u64, f64)>,
    /// (cascade stage that answered, answers, share within budget).
    pub stages: Vec<(&'static str, u64, f64)>,
    pub ranges: Vec<Range>,
}

/// One budget range.
#[derive(Debug, Clone, Serialize)]
pub struct Range {
    pub label: String,
    pub requests: u64,
    pub within: f64,
    /// Escalated answers (the LLM's) over answered requests.
    pub escalated: f64,
    pub degraded: f64,
}

fn within(o: &Outcome) -> bool {
    o.error.is_none()
        && o.budget_ms
            .is_some_and(|b| o.latency_us <= u64::from(b) * 1000)
}

fn share(n: usize, of: usize) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 / of as f64
    }
}

/// The report of `outcomes` (`None` when none carried a budget).
pub fn report(outcomes: &[Outcome]) -> Option<DeadlineReport> {
    let with: Vec<&Outcome> = outcomes.iter().filter(|o| o.budget_ms.is_some()).collect();
    if with.is_empty() {
        return None;
    }
    let channels = [
        Channel::Served(Served::Tier0),
        Channel::Served(Served::Escalated),
        Channel::Served(Served::Degraded),
    ]
    .iter()
    .map(|&ch| {
        let of: Vec<&&Outcome> = with.iter().filter(|o| Channel::of(o) == ch).collect();
        let n = of.iter().filter(|o| within(o)).count();
        (ch.name(), of.len() as u64, share(n, of.len()))
    })
    .collect();
    let mut stages: Vec<(&'static str, u64, f64)> = Vec::new();
    let mut names: Vec<&'static str> = with.iter().filter_map(|o| o.stage).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let of: Vec<&&Outcome> = with.iter().filter(|o| o.stage == Some(name)).collect();
        let n = of.iter().filter(|o| within(o)).count();
        stages.push((name, of.len() as u64, share(n, of.len())));
    }
    let mut lo = 0u32;
    let mut ranges = Vec::new();
    for hi in EDGES.iter().copied().map(Some).chain([None]) {
        let of: Vec<&&Outcome> = with
            .iter()
            .filter(|o| {
                o.budget_ms
                    .is_some_and(|b| b >= lo && hi.is_none_or(|h| b < h))
            })
            .collect();
        let answered = of.iter().filter(|o| o.error.is_none()).count();
        let count = |ch: Channel| of.iter().filter(|o| Channel::of(o) == ch).count();
        ranges.push(Range {
            label: match hi {
                Some(h) => format!("{lo}–{h} ms"),
                None => format!("≥ {lo} ms"),
            },
            requests: of.len() as u64,
            within: share(of.iter().filter(|o| within(o)).count(), of.len()),
            escalated: share(count(Channel::Served(Served::Escalated)), answered),
            degraded: share(count(Channel::Served(Served::Degraded)), answered),
        });
        lo = hi.unwrap_or(lo);
    }
    Some(DeadlineReport {
        requests: with.len() as u64,
        within: share(with.iter().filter(|o| within(o)).count(), with.len()),
        channels,
        stages,
        ranges,
    })
}

/// The report's lines in the terminal report.
pub fn render(r: &DeadlineReport) -> String {
    let mut s = String::new();
    let per: Vec<String> = r
        .channels
        .iter()
        .filter(|(_, n, _)| *n > 0)
        .map(|(c, _, w)| format!("{c} {:.1}%", 100.0 * w))
        .collect();
    let _ = writeln!(
        s,
        "  deadlines: {:.1}% of {} requests answered within budget ({})",
        100.0 * r.within,
        r.requests,
        per.join(", ")
    );
    if !r.stages.is_empty() {
        let per: Vec<String> = r
            .stages
            .iter()
            .map(|(st, n, w)| format!("{st} {n} ({:.1}% within)", 100.0 * w))
            .collect();
        let _ = writeln!(s, "  answered by stage: {}", per.join(", "));
    }
    let _ = writeln!(
        s,
        "  {:<14} {:>8} {:>8} {:>10} {:>9}",
        "budget", "requests", "within", "escalated", "degraded"
    );
    for g in r.ranges.iter().filter(|g| g.requests > 0) {
        let _ = writeln!(
            s,
            "  {:<14} {:>8} {:>7.1}% {:>9.1}% {:>8.1}%",
            g.label,
            g.requests,
            100.0 * g.within,
            100.0 * g.escalated,
            100.0 * g.degraded
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_draws_stay_in_range() {
        let d: DeadlineSpec = "200-5000".parse().unwrap();
        assert_eq!((d.min_ms, d.max_ms), (200, 5000));
        let fixed: DeadlineSpec = "750".parse().unwrap();
        assert_eq!(fixed.draw(1, 2), 750);
        for bad in ["", "0", "5-2", "a-b", "-3", "1.5"] {
            assert!(bad.parse::<DeadlineSpec>().is_err(), "{bad}");
        }
        let draws: Vec<u32> = (0..2000).map(|n| d.draw(7, n)).collect();
        assert!(draws.iter().all(|b| (200..=5000).contains(b)));
        // Spread over the range: every fifth of it is drawn.
        for k in 0..5 {
            let lo = 200 + k * 960;
            assert!(draws.iter().any(|b| (lo..lo + 960).contains(b)), "{k}");
        }
        assert_eq!(d.draw(7, 11), d.draw(7, 11));
    }

    #[test]
    fn answers_count_within_budget_per_channel_and_range() {
        let o =
            |budget: u32, ms: u64, tier: &'static str, degraded: Option<&'static str>| Outcome {
                latency_us: ms * 1000,
                tier: Some(tier),
                degraded,
                budget_ms: Some(budget),
                ..Outcome::default()
            };
        let os = vec![
            o(300, 50, "tier0", Some("deadline_unreachable")),
            o(300, 400, "tier0", Some("deadline_unreachable")),
            o(3000, 900, "llm", None),
            o(3000, 2900, "llm", None),
            Outcome {
                error: Some("timeout"),
                ..o(3000, 3100, "llm", None)
            },
        ];
        let r = report(&os).unwrap();
        assert_eq!(r.requests, 5);
        assert!((r.within - 0.6).abs() < 1e-9, "{r:?}");
        let short = &r.ranges[0];
        assert_eq!((short.requests, short.degraded), (2, 1.0));
        assert!((short.within - 0.5).abs() < 1e-9);
        let long = &r.ranges[3];
        assert_eq!(long.requests, 3);
        assert_eq!(long.escalated, 1.0);
        assert!(render(&r).contains("within budget"));
        assert!(report(&[Outcome::default()]).is_none());
    }
}
