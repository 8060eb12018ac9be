//! Latency-injection A/B tests (`[[experiments]]`, `/admin/experiments`): a request on a route an experiment
//! names is assigned a variant by a stable hash of its `user` (else its `x-request-id`; else at random), the
//! variant's delay is added on the server before the response goes out (as Envoy's fault filter does, so the
//! client sees it in TTFT too), and the variant is returned in `x-tiergate-variant` (every door) and labelled in metrics.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rand::Rng;
use tiergate_config::{DelayConfig, ExperimentConfig};

/// The experiments in force (replaced as a whole by `PUT /admin/experiments`).
#[derive(Debug, Default)]
pub(crate) struct Experiments {
    list: RwLock<Arc<Vec<ExperimentConfig>>>,
}

/// A request's variant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assigned {
    /// The experiment's name, or `control`.
    pub variant: String,
    /// The delay to add (zero for `control`).
    pub delay: Duration,
}

impl Experiments {
    /// Starts with `list` (already validated).
    pub(crate) fn new(list: Vec<ExperimentConfig>) -> Self {
        Self {
            list: RwLock::new(Arc::new(list)),
        }
    }

    /// The experiments in force.
    pub(crate) fn current(&self) -> Arc<Vec<ExperimentConfig>> {
        self.list
            .read()
            .map_or_else(|p| p.into_inner().clone(), |g| g.clone())
    }

    /// Replaces them (validate first).
    pub(crate) fn replace(&self, list: Vec<ExperimentConfig>) {
        match self.list.write() {
            Ok(mut g) => *g = Arc::new(list),
            Err(p) => *p.into_inner() = Arc::new(list),
        }
    }

    /// The variant of a request on `route` (`None`: no experiment names the route), by its `user`, else its
    /// `x-request-id`.
    pub(crate) fn assign(
        &self,
        route: &str,
        user: Option<&str>,
        request_id: Option<&str>,
    ) -> Option<Assigned> {
        let list = self.current();
        if !list.iter().any(|e| e.routes.iter().any(|r| r == route)) {
            return None;
        }
        let key = user
            .filter(|u| !u.is_empty())
            .or(request_id.filter(|r| !r.is_empty()));
        let b = match key {
            Some(k) => bucket(k),
            None => rand::thread_rng().gen::<f64>(),
        };
        Some(match variant_of(&list, route, b) {
            Some(e) => Assigned {
                variant: e.name.clone(),
                delay: sample(&e.delay, &mut rand::thread_rng()),
            },
            None => Assigned {
                variant: "control".into(),
                delay: Duration::ZERO,
            },
        })
    }
}

/// A key's place in [0, 1): FNV-1a (64 bits), the same on every replica and across restarts.
pub(crate) fn bucket(key: &str) -> f64 {
    let mut h = tiergate_core::fnv::Fnv::new()
        .eat(b"tiergate-experiments:")
        .eat(key.as_bytes())
        .finish();
    // FNV's low bits mix poorly: fold the high half in before taking 53 bits.
    h ^= h >> 29;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 32;
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The experiment whose slice of [0, 1) holds `b` (slices laid out in list order), if it runs on `route`.
pub(crate) fn variant_of<'a>(
    list: &'a [ExperimentConfig],
    route: &str,
    b: f64,
) -> Option<&'a ExperimentConfig> {
    let mut start = 0.0;
    for e in list {
        let end = start + e.share;
        if b >= start && b < end {
            return e.routes.iter().any(|r| r == route).then_some(e);
        }
        start = end;
    }
    None
}

/// One delay drawn from `d`.
pub(crate) fn sample(d: &DelayConfig, rng: &mut impl Rng) -> Duration {
    let ms = match *d {
        DelayConfig::Fixed { ms } => ms as f64,
        DelayConfig::Uniform { min_ms, max_ms } => rng.gen_range(min_ms as f64..=max_ms as f64),
        DelayConfig::Exponential { mean_ms, max_ms } => {
            let u: f64 = rng.gen();
            (-mean_ms * (1.0 - u).ln()).min(max_ms as f64)
        }
    };
    Duration::from_secs_f64(ms.max(0.0) / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn exp(name: &str, share: f64, delay: DelayConfig, routes: &[&str]) -> ExperimentConfig {
        ExperimentConfig {
            name: name.into(),
            share,
            delay,
            routes: routes.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn assignment_is_stable_and_matches_the_shares() {
        let list = vec![
            exp("a", 0.2, DelayConfig::Fixed { ms: 300 }, &["classify"]),
            exp(
                "b",
                0.1,
                DelayConfig::Fixed { ms: 900 },
                &["classify", "answer"],
            ),
        ];
        let x = Experiments::new(list.clone());
        let h = None;
        let n = 20_000;
        let mut counts = std::collections::HashMap::new();
        for i in 0..n {
            let user = format!("user-{i}");
            let v = x.assign("classify", Some(&user), h).unwrap();
            // Stable: the same user, the same variant, every time.
            assert_eq!(
                x.assign("classify", Some(&user), h).unwrap().variant,
                v.variant
            );
            *counts.entry(v.variant).or_insert(0u32) += 1;
        }
        let share = |k: &str| f64::from(counts[k]) / f64::from(n);
        // 20,000 draws: the standard error of a 0.2 share is 0.003; ±0.015 is 5 of them.
        assert!((share("a") - 0.2).abs() < 0.015, "{counts:?}");
        assert!((share("b") - 0.1).abs() < 0.015, "{counts:?}");
        assert!((share("control") - 0.7).abs() < 0.015, "{counts:?}");
        // `a` does not name `answer`: its slice is control there; `b` runs on both.
        let on_answer: Vec<String> = (0..2000)
            .map(|i| {
                x.assign("answer", Some(&format!("user-{i}")), h)
                    .unwrap()
                    .variant
            })
            .collect();
        assert!(!on_answer.iter().any(|v| v == "a"));
        assert!(on_answer.iter().any(|v| v == "b"));
        // A route no experiment names: no variant at all.
        assert_eq!(x.assign("generate", Some("user-1"), h), None);
        // Delays are the variant's; control gets none.
        for i in 0..200 {
            let v = x.assign("classify", Some(&format!("u{i}")), h).unwrap();
            let want = match v.variant.as_str() {
                "a" => 300,
                "b" => 900,
                _ => 0,
            };
            assert_eq!(v.delay, Duration::from_millis(want));
        }
    }

    #[test]
    fn the_request_id_keys_requests_without_a_user() {
        let x = Experiments::new(vec![exp(
            "a",
            0.5,
            DelayConfig::Fixed { ms: 1 },
            &["classify"],
        )]);
        let h = Some("req-42");
        let v = x.assign("classify", None, h).unwrap().variant;
        for _ in 0..20 {
            assert_eq!(x.assign("classify", Some(""), h).unwrap().variant, v);
        }
    }

    #[test]
    fn delays_follow_their_distribution() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = 20_000;
        let draw = |d: &DelayConfig, rng: &mut rand::rngs::StdRng| -> Vec<f64> {
            (0..n).map(|_| sample(d, rng).as_secs_f64() * 1e3).collect()
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let u = draw(
            &DelayConfig::Uniform {
                min_ms: 300,
                max_ms: 800,
            },
            &mut rng,
        );
        assert!(u.iter().all(|&x| (300.0..=800.0).contains(&x)));
        assert!((mean(&u) - 550.0).abs() < 5.0, "{}", mean(&u));
        // Each tenth of the range holds about a tenth of the draws.
        for k in 0..10 {
            let lo = 300.0 + 50.0 * f64::from(k);
            let c = u.iter().filter(|&&x| x >= lo && x < lo + 50.0).count() as f64 / n as f64;
            assert!((c - 0.1).abs() < 0.01, "decile {k}: {c}");
        }
        let e = draw(
            &DelayConfig::Exponential {
                mean_ms: 200.0,
                max_ms: 60_000,
            },
            &mut rng,
        );
        assert!((mean(&e) - 200.0).abs() < 8.0, "{}", mean(&e));
        // P(X > mean) = e^-1 for an exponential.
        let above = e.iter().filter(|&&x| x > 200.0).count() as f64 / n as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.015, "{above}");
        let cut = draw(
            &DelayConfig::Exponential {
                mean_ms: 200.0,
                max_ms: 250,
            },
            &mut rng,
        );
        assert!(cut.iter().all(|&x| x <= 250.0));
        assert_eq!(
            sample(&DelayConfig::Fixed { ms: 120 }, &mut rng),
            Duration::from_millis(120)
        );
    }
}
