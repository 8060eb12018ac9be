//! Client patience (`--patience`) and the variants of a latency experiment side by side.
//!
//! A user with patience T abandons a request that takes longer than T. With T drawn from a distribution F,
//! a request of latency L is abandoned with probability F(L); a variant's abandoned share is the mean of F(L)
//! over its answers (computed, not sampled: no noise on top of the run's own).

use serde::Serialize;

use crate::stats::{band, ChannelStats, Outcome};

/// A patience distribution, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "dist", rename_all = "snake_case")]
pub enum Patience {
    /// Everyone waits exactly `ms`.
    Fixed { ms: f64 },
    /// Uniform in [min, max].
    Uniform { min_ms: f64, max_ms: f64 },
    /// Exponential with mean `mean_ms`.
    Exponential { mean_ms: f64 },
    /// Log-normal with median `median_ms` and log-space σ `sigma`.
    Lognormal { median_ms: f64, sigma: f64 },
}

impl std::str::FromStr for Patience {
    type Err = String;

    /// `fixed:2s`, `uniform:1s..5s`, `exp:3s` (mean), `lognormal:2s,0.6` (median, σ).
    fn from_str(s: &str) -> Result<Self, String> {
        let d = |x: &str| match x.trim() {
            "0" | "0s" | "0ms" => Ok(0.0),
            x => crate::parse_duration(x).map(|d| d.as_secs_f64() * 1e3),
        };
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            format!("--patience `{s}`: use fixed:2s, uniform:1s..5s, exp:3s or lognormal:2s,0.6")
        })?;
        let p = match kind {
            "fixed" => Self::Fixed { ms: d(rest)? },
            "uniform" => {
                let (a, b) = rest.split_once("..").ok_or("--patience uniform:MIN..MAX")?;
                let (min_ms, max_ms) = (d(a)?, d(b)?);
                if min_ms > max_ms {
                    return Err("--patience uniform: MIN must not exceed MAX".into());
                }
                Self::Uniform { min_ms, max_ms }
            }
            "exp" => Self::Exponential { mean_ms: d(rest)? },
            "lognormal" => {
                let (m, sg) = rest
                    .split_once(',')
                    .ok_or("--patience lognormal:MEDIAN,SIGMA")?;
                let sigma: f64 = sg
                    .trim()
                    .parse()
                    .map_err(|_| format!("--patience lognormal: σ `{sg}` is not a number"))?;
                if !(sigma.is_finite() && sigma > 0.0) {
                    return Err("--patience lognormal: σ must be positive".into());
                }
                Self::Lognormal {
                    median_ms: d(m)?,
                    sigma,
                }
            }
            other => return Err(format!("--patience: unknown distribution `{other}`")),
        };
        Ok(p)
    }
}

impl Patience {
    /// P(patience < `latency_ms`): the chance a user gave up before this answer.
    pub fn gave_up(&self, latency_ms: f64) -> f64 {
        match *self {
            Self::Fixed { ms } => f64::from(u8::from(latency_ms > ms)),
            Self::Uniform { min_ms, max_ms } => {
                if latency_ms <= min_ms {
                    0.0
                } else if latency_ms >= max_ms {
                    1.0
                } else {
                    (latency_ms - min_ms) / (max_ms - min_ms)
                }
            }
            Self::Exponential { mean_ms } => 1.0 - (-latency_ms / mean_ms).exp(),
            Self::Lognormal { median_ms, sigma } => {
                if latency_ms <= 0.0 {
                    0.0
                } else {
                    normal_cdf((latency_ms / median_ms).ln() / sigma)
                }
            }
        }
    }
}

/// Φ(x), from the complementary error function (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7).
fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-z * z).exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

/// One variant of a latency experiment.
#[derive(Debug, Clone, Serialize)]
pub struct VariantStats {
    pub variant: String,
    /// Its answers (errors excluded).
    pub stats: ChannelStats,
    /// With --patience: the share of its answers a user would have abandoned.
    pub abandoned: Option<f64>,
}

/// The variants seen in a run (`x-tiergate-variant`), `control` first.
pub fn variants(
    outcomes: &[Outcome],
    elapsed_s: f64,
    patience: Option<&Patience>,
) -> Vec<VariantStats> {
    let mut names: Vec<&str> = outcomes.iter().filter_map(|o| o.variant).collect();
    names.sort_by_key(|n| (*n != "control", *n));
    names.dedup();
    let total = outcomes.len() as u64;
    names
        .into_iter()
        .map(|name| {
            let served = outcomes
                .iter()
                .filter(move |o| o.variant == Some(name) && o.error.is_none());
            let abandoned = patience.and_then(|p| {
                let (n, sum) = served.clone().fold((0u64, 0.0), |(n, s), o| {
                    (n + 1, s + p.gave_up(o.latency_us as f64 / 1e3))
                });
                (n > 0).then(|| sum / n as f64)
            });
            VariantStats {
                variant: name.to_string(),
                stats: ChannelStats::of(name, served, total, elapsed_s),
                abandoned,
            }
        })
        .collect()
}

/// The side-by-side table.
pub fn render(vs: &[VariantStats]) -> String {
    use std::fmt::Write;
    if vs.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "  latency experiment (x-tiergate-variant):\n  {:<16} {:>7} {:>8} {:>8} {:>8} {:>8}  {:<7} {:>9}\n",
        "variant", "count", "p50 ms", "p95", "p99", "mean", "band", "abandoned"
    );
    for v in vs {
        let l = v.stats.latency.clone().unwrap_or_default();
        let _ = writeln!(
            s,
            "  {:<16} {:>7} {:>8} {:>8} {:>8} {:>8}  {:<7} {:>9}",
            v.variant,
            v.stats.count,
            crate::stats::ms(l.p50_ms),
            crate::stats::ms(l.p95_ms),
            crate::stats::ms(l.p99_ms),
            crate::stats::ms(l.mean_ms),
            v.stats.latency.as_ref().map_or("-", |l| band(l.p95_ms)),
            v.abandoned
                .map_or("-".to_string(), |a| format!("{:.1}%", a * 100.0)),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_forms() {
        assert_eq!("fixed:2s".parse(), Ok(Patience::Fixed { ms: 2000.0 }));
        assert_eq!(
            "uniform:1s..5s".parse(),
            Ok(Patience::Uniform {
                min_ms: 1000.0,
                max_ms: 5000.0
            })
        );
        assert_eq!(
            "exp:3s".parse(),
            Ok(Patience::Exponential { mean_ms: 3000.0 })
        );
        assert_eq!(
            "lognormal:2s,0.6".parse(),
            Ok(Patience::Lognormal {
                median_ms: 2000.0,
                sigma: 0.6
            })
        );
        assert_eq!(
            "uniform:0s..1s".parse(),
            Ok(Patience::Uniform {
                min_ms: 0.0,
                max_ms: 1000.0
            })
        );
        assert!("gauss:1s".parse::<Patience>().is_err());
        assert!("uniform:5s..1s".parse::<Patience>().is_err());
        assert!("lognormal:2s,-1".parse::<Patience>().is_err());
    }

    #[test]
    fn abandonment_is_the_patience_cdf() {
        let u = Patience::Uniform {
            min_ms: 1000.0,
            max_ms: 3000.0,
        };
        assert_eq!(u.gave_up(500.0), 0.0);
        assert_eq!(u.gave_up(2000.0), 0.5);
        assert_eq!(u.gave_up(4000.0), 1.0);
        let e = Patience::Exponential { mean_ms: 1000.0 };
        assert!((e.gave_up(1000.0) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        let l = Patience::Lognormal {
            median_ms: 2000.0,
            sigma: 0.5,
        };
        assert!((l.gave_up(2000.0) - 0.5).abs() < 1e-7, "the median");
        // One σ above the median: Φ(1) = 0.841345.
        assert!((l.gave_up(2000.0 * 0.5f64.exp()) - 0.841_345).abs() < 1e-5);
        assert_eq!(Patience::Fixed { ms: 100.0 }.gave_up(100.0), 0.0);
        assert_eq!(Patience::Fixed { ms: 100.0 }.gave_up(100.1), 1.0);
    }

    #[test]
    fn variants_side_by_side() {
        let o = |ms: u64, v: &'static str| Outcome {
            latency_us: ms * 1000,
            status: 200,
            tier: Some("tier0"),
            variant: Some(v),
            ..Outcome::default()
        };
        let os: Vec<Outcome> = (0..100)
            .map(|i| o(10 + i, "control"))
            .chain((0..100).map(|i| o(500 + 10 * i, "slow")))
            .chain([Outcome {
                error: Some("timeout"),
                variant: Some("slow"),
                ..Outcome::default()
            }])
            .collect();
        let p = Patience::Uniform {
            min_ms: 0.0,
            max_ms: 2000.0,
        };
        let vs = variants(&os, 10.0, Some(&p));
        assert_eq!(
            vs.iter().map(|v| v.variant.as_str()).collect::<Vec<_>>(),
            ["control", "slow"]
        );
        assert_eq!(vs[1].stats.count, 100, "errors are not answers");
        // control: mean latency 59.5 ms → 2.975%; slow: mean 995 ms → 49.75%.
        assert!((vs[0].abandoned.unwrap() - 0.029_75).abs() < 1e-9);
        assert!((vs[1].abandoned.unwrap() - 0.4975).abs() < 1e-9);
        assert!(render(&vs).contains("slow"));
        assert!(variants(&os[..0], 1.0, None).is_empty());
    }
}
