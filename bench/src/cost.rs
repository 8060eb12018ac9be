//! Cost per tier (`--cost FILE`): what a run's traffic costs on the fleet a price file describes.
//!
//! Each instance type has an hourly price, the channels it runs (e.g. a CPU instance for `tier0` and
//! `degraded`, a GPU instance for `escalated`), and either a fixed `replicas` count or a `capacity_rps` (the
//! requests per second one replica serves): then the fleet is sized to the run's traffic,
//! max(`min_replicas`, ⌈rate ÷ capacity⌉) replicas, which is how a policy that escalates less needs fewer GPUs.
//! An instance running several channels is split between them by their request counts. A channel's cost per 1,000 requests is its share of the fleet's hourly
//! cost over its requests per hour *at the run's rate*: run the bench at the production rate (`--rate`) for
//! production costs, or closed loop for the cost at capacity. With `latency_penalty = x`, a channel whose P95
//! is outside its band costs (1 + x) times as much (the band a channel should stay in: `[bands]`, by default
//! Tier-0 for `tier0`, Tier-4 for `escalated` and `degraded`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::stats::ChannelStats;

/// The channels a price file can place: the server's.
fn channels() -> impl Iterator<Item = &'static str> {
    tiergate_core::outcome::Channel::ALL
        .iter()
        .map(|c| c.as_str())
}
/// The band names, fastest first.
fn bands() -> impl Iterator<Item = &'static str> {
    tiergate_core::bands::BANDS.iter().map(|(name, _, _)| *name)
}

/// A price file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CostFile {
    /// Where the prices come from (say "example" for made-up ones).
    #[serde(default)]
    pub note: String,
    #[serde(default = "usd")]
    pub currency: String,
    /// Extra cost factor for a channel out of its band (0: none).
    #[serde(default)]
    pub latency_penalty: f64,
    /// The band each channel should stay in (defaults: tier0 Tier-0, escalated and degraded Tier-4).
    #[serde(default)]
    pub bands: BTreeMap<String, String>,
    pub instance: Vec<Instance>,
}

fn usd() -> String {
    "USD".into()
}

fn one() -> u32 {
    1
}

/// An instance type.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub name: String,
    /// Price per instance-hour.
    pub hourly: f64,
    /// A fixed replica count (without `capacity_rps`).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Requests per second one replica serves: the fleet is sized to the run's traffic.
    #[serde(default)]
    pub capacity_rps: Option<f64>,
    /// The fewest replicas when sized by `capacity_rps`.
    #[serde(default)]
    pub min_replicas: u32,
    /// The channels it runs.
    pub channels: Vec<String>,
}

impl Instance {
    /// Replicas for channels with `rate` requests per second in all.
    pub fn replicas_for(&self, rate: f64) -> u32 {
        match self.capacity_rps {
            Some(c) => ((rate / c).ceil() as u32).max(self.min_replicas),
            None => self.replicas,
        }
    }
}

impl CostFile {
    /// Parses and checks a price file.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let f: CostFile = toml::from_str(raw).map_err(|e| e.to_string())?;
        if f.instance.is_empty() {
            return Err("no [[instance]]".into());
        }
        for i in &f.instance {
            if !(i.hourly.is_finite() && i.hourly >= 0.0) || i.replicas == 0 {
                return Err(format!(
                    "instance `{}`: hourly must be ≥ 0 and replicas ≥ 1",
                    i.name
                ));
            }
            if i.capacity_rps.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return Err(format!("instance `{}`: capacity_rps must be > 0", i.name));
            }
            if i.channels.is_empty() {
                return Err(format!("instance `{}`: name the channels it runs", i.name));
            }
            if let Some(c) = i
                .channels
                .iter()
                .find(|c| !channels().any(|k| k == c.as_str()))
            {
                return Err(format!(
                    "instance `{}`: unknown channel `{c}` ({})",
                    i.name,
                    channels().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if !(f.latency_penalty.is_finite() && f.latency_penalty >= 0.0) {
            return Err("latency_penalty must be ≥ 0".into());
        }
        for (c, b) in &f.bands {
            if !channels().any(|k| k == c.as_str()) || !bands().any(|n| n == b) {
                return Err(format!(
                    "bands: `{c} = {b}`: a channel ({}) and a band ({})",
                    channels().collect::<Vec<_>>().join(", "),
                    bands().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Ok(f)
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read cost file {}: {e}", path.display()))?;
        Self::parse(&raw).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn band_of(&self, channel: &str) -> &str {
        self.bands.get(channel).map(String::as_str).unwrap_or(
            if channel == tiergate_core::outcome::Channel::Tier0.as_str() {
                "Tier-0"
            } else {
                "Tier-4"
            },
        )
    }
}

/// An instance type as sized for a run.
#[derive(Debug, Clone, Serialize)]
pub struct Sized {
    pub name: String,
    pub replicas: u32,
    pub hourly: f64,
}

/// One channel's cost.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelCost {
    pub channel: String,
    pub requests_per_s: f64,
    /// Its share of the fleet's hourly cost.
    pub hourly: f64,
    /// Per 1,000 of its requests (penalty included).
    pub per_1k: Option<f64>,
    /// Its P95 is outside its band (penalised when the file sets a penalty).
    pub out_of_band: bool,
}

/// A run's cost.
#[derive(Debug, Clone, Serialize)]
pub struct RunCost {
    pub currency: String,
    pub fleet_hourly: f64,
    /// The fleet as sized for the run.
    pub instances: Vec<Sized>,
    pub channels: Vec<ChannelCost>,
    /// Per 1,000 answered requests, all channels (penalties included).
    pub blended_per_1k: Option<f64>,
    /// The escalated channel's share of the cost.
    pub escalated_cost_share: Option<f64>,
    /// What escalation adds per 1,000 answered requests.
    pub escalated_per_1k_served: Option<f64>,
    /// Hourly cost of instances whose channels had no traffic in the run.
    pub idle_hourly: f64,
}

/// The cost of a run, given its per-channel statistics, on the fleet of `f`.
pub fn of(f: &CostFile, stats: &[ChannelStats]) -> RunCost {
    let channel = |name: &str| stats.iter().find(|c| c.channel == name);
    let rate = |c: &str| channel(c).map_or(0.0, |s| s.requests_per_s);
    let mut hourly: BTreeMap<&str, f64> = channels().map(|c| (c, 0.0)).collect();
    let mut idle = 0.0;
    let mut instances = Vec::new();
    for i in &f.instance {
        let total: f64 = i.channels.iter().map(|c| rate(c)).sum();
        let replicas = i.replicas_for(total);
        let cost = i.hourly * f64::from(replicas);
        instances.push(Sized {
            name: i.name.clone(),
            replicas,
            hourly: cost,
        });
        if total <= 0.0 {
            idle += cost;
            continue;
        }
        for c in &i.channels {
            *hourly.entry(c.as_str()).or_insert(0.0) += cost * rate(c) / total;
        }
    }
    let per_1k = |cost_h: f64, rps: f64| (rps > 0.0).then(|| cost_h / (rps * 3600.0) * 1000.0);
    let mut penalised_total = idle;
    let channels: Vec<ChannelCost> = channels()
        .map(|c| {
            let p95 = channel(c)
                .and_then(|s| s.latency.as_ref())
                .map(|l| l.p95_ms);
            let out_of_band = p95.is_some_and(|p| {
                let want = f.band_of(c);
                bands().position(|b| b == crate::stats::band(p)) > bands().position(|b| b == want)
                    || crate::stats::band(p) == "none"
            });
            let factor = if out_of_band {
                1.0 + f.latency_penalty
            } else {
                1.0
            };
            let h = hourly[c] * factor;
            penalised_total += h;
            ChannelCost {
                channel: c.to_string(),
                requests_per_s: rate(c),
                hourly: h,
                per_1k: per_1k(h, rate(c)),
                out_of_band,
            }
        })
        .collect();
    let served = channel("served").map_or(0.0, |s| s.requests_per_s);
    let esc = channels.iter().find(|c| c.channel == "escalated");
    RunCost {
        currency: f.currency.clone(),
        fleet_hourly: instances.iter().map(|i| i.hourly).sum(),
        instances,
        blended_per_1k: per_1k(penalised_total, served),
        escalated_cost_share: esc
            .filter(|_| penalised_total > 0.0)
            .map(|e| e.hourly / penalised_total),
        escalated_per_1k_served: esc.and_then(|e| per_1k(e.hourly, served)),
        idle_hourly: idle,
        channels,
    }
}

/// The cost table of one run.
pub fn render(c: &RunCost) -> String {
    let m = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
    let mut s = format!(
        "  cost ({}; fleet {:.2}/h: {}{}):\n  {:<10} {:>9} {:>10} {:>12}\n",
        c.currency,
        c.fleet_hourly,
        c.instances
            .iter()
            .map(|i| format!("{} × {}", i.replicas, i.name))
            .collect::<Vec<_>>()
            .join(", "),
        if c.idle_hourly > 0.0 {
            format!(", {:.2}/h idle", c.idle_hourly)
        } else {
            String::new()
        },
        "channel",
        "req/s",
        "cost/h",
        "per 1k req"
    );
    for ch in &c.channels {
        let _ = writeln!(
            s,
            "  {:<10} {:>9.1} {:>10.4} {:>12}{}",
            ch.channel,
            ch.requests_per_s,
            ch.hourly,
            m(ch.per_1k),
            if ch.out_of_band {
                "  (out of band)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        s,
        "  blended: {} per 1k answered; escalation: {} of the cost, {} per 1k answered",
        m(c.blended_per_1k),
        c.escalated_cost_share
            .map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
        m(c.escalated_per_1k_served)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RunReport;
    use crate::run::RunData;
    use crate::stats::Outcome;

    const FILE: &str = r#"
        note = "example prices, not quotes"
        latency_penalty = 0.5
        [[instance]]
        name = "cpu"
        hourly = 0.20
        replicas = 2
        channels = ["tier0", "degraded"]
        [[instance]]
        name = "gpu"
        hourly = 1.00
        channels = ["escalated"]
    "#;

    fn run(tier0: u64, escalated: u64, esc_ms: u64) -> RunReport {
        let o = |tier: &'static str, ms: u64| Outcome {
            latency_us: ms * 1000,
            status: 200,
            tier: Some(tier),
            ..Outcome::default()
        };
        let outcomes = (0..tier0)
            .map(|_| o("tier0", 10))
            .chain((0..escalated).map(|_| o("llm", esc_ms)))
            .collect();
        let data = RunData {
            outcomes,
            gave_up: Default::default(),
            timeout_s: 30.0,
            elapsed_s: 100.0,
            scrape: Default::default(),
            client_cpu_s: 0.0,
            interrupted: false,
            operator: None,
        };
        RunReport::build("run", serde_json::Value::Null, &data, &[], None)
    }

    #[test]
    fn costs_per_channel_and_blended() {
        let f = CostFile::parse(FILE).unwrap();
        // 9 req/s Tier-0, 1 req/s escalated (100 s run): 32,400 and 3,600 requests an hour.
        let c = of(&f, &run(900, 100, 2000).channels);
        assert_eq!(c.fleet_hourly, 1.4);
        let ch = |n: &str| c.channels.iter().find(|x| x.channel == n).unwrap().clone();
        assert!(
            (ch("tier0").hourly - 0.4).abs() < 1e-9,
            "degraded had no traffic"
        );
        assert!((ch("tier0").per_1k.unwrap() - 0.4 / 32.4).abs() < 1e-9);
        assert!((ch("escalated").per_1k.unwrap() - 1.0 / 3.6).abs() < 1e-9);
        assert!((c.blended_per_1k.unwrap() - 1.4 / 36.0).abs() < 1e-9);
        assert!((c.escalated_cost_share.unwrap() - 1.0 / 1.4).abs() < 1e-9);
        assert!((c.escalated_per_1k_served.unwrap() - 1.0 / 36.0).abs() < 1e-9);
        assert!(!ch("escalated").out_of_band);
        // The escalated channel past Tier-4 (13 s): its cost × 1.5.
        let slow = of(&f, &run(900, 100, 13_000).channels);
        let e = slow
            .channels
            .iter()
            .find(|x| x.channel == "escalated")
            .unwrap();
        assert!(e.out_of_band);
        assert!((e.hourly - 1.5).abs() < 1e-9);
        assert!((slow.blended_per_1k.unwrap() - 1.9 / 36.0).abs() < 1e-9);
        assert!(render(&slow).contains("out of band"));
        // No escalations at all: the GPU is idle cost, still paid for in the blend.
        let idle = of(&f, &run(1000, 0, 0).channels);
        assert_eq!(idle.idle_hourly, 1.0);
        assert!((idle.blended_per_1k.unwrap() - 1.4 / 36.0).abs() < 1e-9);
    }

    #[test]
    fn a_sized_fleet_follows_the_traffic() {
        let sized = FILE.replace(
            "name = \"gpu\"",
            "name = \"gpu\"\ncapacity_rps = 0.3\nmin_replicas = 0",
        );
        let f = CostFile::parse(&sized).unwrap();
        // 1 escalation/s at 0.3 per replica: 4 GPUs.
        let c = of(&f, &run(900, 100, 2000).channels);
        assert_eq!(c.instances[1].replicas, 4);
        assert!((c.fleet_hourly - 4.4).abs() < 1e-9);
        // No escalations: no GPU at all.
        let c = of(&f, &run(1000, 0, 0).channels);
        assert_eq!(c.instances[1].replicas, 0);
        assert!((c.fleet_hourly - 0.4).abs() < 1e-9);
        assert_eq!(c.idle_hourly, 0.0);
        let bad = sized.replace("capacity_rps = 0.3", "capacity_rps = 0");
        assert!(CostFile::parse(&bad).is_err());
    }

    #[test]
    fn price_files_are_checked() {
        assert!(CostFile::parse("instance = []").is_err());
        let bad = FILE.replace("\"escalated\"]", "\"gpu\"]");
        assert!(CostFile::parse(&bad)
            .unwrap_err()
            .contains("unknown channel"));
        let neg = FILE.replace("hourly = 1.00", "hourly = -1.0");
        assert!(CostFile::parse(&neg).is_err());
        let band = format!("[bands]\ntier0 = \"Tier-9\"\n{FILE}");
        assert!(CostFile::parse(&band).is_err());
    }

    #[test]
    fn the_examples_in_the_repository_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("costs");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let f = CostFile::load(&p).unwrap();
            assert!(f.note.to_lowercase().contains("example"), "{}", p.display());
            n += 1;
        }
        assert!(n >= 1);
    }
}
