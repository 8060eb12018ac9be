//! Arrival schedules for the open loop: when each request is *meant* to be sent.

use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::parse_duration;

/// The shape of the arrival rate over the run, as given on the command line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScheduleSpec {
    /// The base rate throughout.
    Constant,
    /// Linear from `from` (default base/10) to the base rate over the run.
    Ramp { from: Option<f64> },
    /// Base rate, then `factor` × base from `at` for `dur`, then base again (defaults: middle third, ×3).
    Surge {
        at: Option<Duration>,
        dur: Option<Duration>,
        factor: f64,
    },
}

impl FromStr for ScheduleSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, params) = s.split_once(':').unwrap_or((s, ""));
        let mut kv = Vec::new();
        for p in params.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("schedule parameter `{p}`: expected key=value"))?;
            kv.push((k.trim().to_string(), v.trim().to_string()));
        }
        let number = |k: &str, v: &str| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("schedule parameter {k}={v}: expected a positive number"))
        };
        match name.trim() {
            "constant" if kv.is_empty() => Ok(Self::Constant),
            "constant" => Err("`constant` takes no parameters".into()),
            "ramp" => {
                let mut from = None;
                for (k, v) in &kv {
                    match k.as_str() {
                        "from" => from = Some(number(k, v)?),
                        _ => return Err(format!("ramp has no parameter `{k}` (it has: from)")),
                    }
                }
                Ok(Self::Ramp { from })
            }
            "surge" => {
                let (mut at, mut dur, mut factor) = (None, None, 3.0);
                for (k, v) in &kv {
                    match k.as_str() {
                        "at" => at = Some(parse_duration(v)?),
                        "for" => dur = Some(parse_duration(v)?),
                        "x" => factor = number(k, v)?,
                        _ => {
                            return Err(format!(
                                "surge has no parameter `{k}` (it has: at, for, x)"
                            ))
                        }
                    }
                }
                Ok(Self::Surge { at, dur, factor })
            }
            other => Err(format!(
                "unknown schedule `{other}` (constant, ramp[:from=R0], surge[:at=20s,for=20s,x=3])"
            )),
        }
    }
}

/// A schedule resolved against a base rate and a run length.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub base: f64,
    pub spec: ScheduleSpec,
    /// The send window; `None` when only a request count bounds the run (constant schedules only).
    pub window: Option<Duration>,
}

impl Schedule {
    /// Requests per second meant at `t` into the run.
    pub fn rate_at(&self, t: Duration) -> f64 {
        let w = self.window.map_or(f64::INFINITY, |w| w.as_secs_f64());
        let t = t.as_secs_f64();
        match &self.spec {
            ScheduleSpec::Constant => self.base,
            ScheduleSpec::Ramp { from } => {
                let from = from.unwrap_or(self.base / 10.0);
                let f = if w.is_finite() {
                    (t / w).clamp(0.0, 1.0)
                } else {
                    1.0
                };
                from + (self.base - from) * f
            }
            ScheduleSpec::Surge { at, dur, factor } => {
                let at = at.map_or(w / 3.0, |d| d.as_secs_f64());
                let dur = dur.map_or(w / 3.0, |d| d.as_secs_f64());
                if t >= at && t < at + dur {
                    self.base * factor
                } else {
                    self.base
                }
            }
        }
    }

    /// The intended send offsets, constant spacing or exponential (Poisson), until the window ends.
    pub fn arrivals(&self, poisson: bool, seed: u64) -> Arrivals {
        Arrivals {
            schedule: self.clone(),
            poisson,
            rng: StdRng::seed_from_u64(seed ^ 0x05ee_da77_1a15),
            next: 0.0,
        }
    }
}

/// Iterator over intended send offsets.
pub struct Arrivals {
    schedule: Schedule,
    poisson: bool,
    rng: StdRng,
    next: f64,
}

impl Iterator for Arrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let t = Duration::from_secs_f64(self.next);
        if self.schedule.window.is_some_and(|w| t >= w) {
            return None;
        }
        let rate = self.schedule.rate_at(t).max(1e-6);
        let gap = if self.poisson {
            let u: f64 = self.rng.gen_range(f64::EPSILON..1.0);
            -u.ln() / rate
        } else {
            1.0 / rate
        };
        self.next += gap;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(spec: &str, base: f64, secs: u64) -> Schedule {
        Schedule {
            base,
            spec: spec.parse().unwrap(),
            window: Some(Duration::from_secs(secs)),
        }
    }

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            "constant".parse::<ScheduleSpec>(),
            Ok(ScheduleSpec::Constant)
        );
        assert_eq!(
            "ramp:from=5".parse::<ScheduleSpec>(),
            Ok(ScheduleSpec::Ramp { from: Some(5.0) })
        );
        assert_eq!(
            "surge:at=10s,for=5s,x=4".parse::<ScheduleSpec>(),
            Ok(ScheduleSpec::Surge {
                at: Some(Duration::from_secs(10)),
                dur: Some(Duration::from_secs(5)),
                factor: 4.0
            })
        );
        assert!("burst"
            .parse::<ScheduleSpec>()
            .unwrap_err()
            .contains("unknown schedule"));
        assert!("surge:x=-1"
            .parse::<ScheduleSpec>()
            .unwrap_err()
            .contains("positive"));
        assert!("surge:y=2"
            .parse::<ScheduleSpec>()
            .unwrap_err()
            .contains("no parameter"));
        assert!("ramp:from"
            .parse::<ScheduleSpec>()
            .unwrap_err()
            .contains("key=value"));
    }

    #[test]
    fn surge_triples_the_middle_third() {
        let s = sched("surge", 10.0, 30);
        assert_eq!(s.rate_at(Duration::from_secs(5)), 10.0);
        assert_eq!(s.rate_at(Duration::from_secs(15)), 30.0);
        assert_eq!(s.rate_at(Duration::from_secs(25)), 10.0);
        // Count: 10 s × 10 + 10 s × 30 + 10 s × 10 = 500 arrivals.
        let n = s.arrivals(false, 0).count() as i64;
        assert!((n - 500).abs() <= 2, "{n}");
    }

    #[test]
    fn ramp_is_linear() {
        let s = sched("ramp:from=2", 12.0, 10);
        assert_eq!(s.rate_at(Duration::ZERO), 2.0);
        assert!((s.rate_at(Duration::from_secs(5)) - 7.0).abs() < 1e-9);
        // Integral of the rate: (2 + 12) / 2 × 10 = 70.
        let n = s.arrivals(false, 0).count() as i64;
        assert!((n - 70).abs() <= 2, "{n}");
    }

    #[test]
    fn poisson_has_the_right_mean_and_is_seeded() {
        let s = sched("constant", 200.0, 50);
        let a: Vec<Duration> = s.arrivals(true, 7).collect();
        let b: Vec<Duration> = s.arrivals(true, 7).collect();
        assert_eq!(a, b);
        // 10,000 expected; the Poisson count's sd is 100.
        assert!((a.len() as i64 - 10_000).abs() < 500, "{}", a.len());
        let gaps: Vec<f64> = a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // Exponential: sd == mean.
        assert!((var.sqrt() / mean - 1.0).abs() < 0.1);
        let c: Vec<Duration> = s.arrivals(false, 7).collect();
        assert!((c[1] - c[0]).as_secs_f64() - 0.005 < 1e-9);
    }
}
