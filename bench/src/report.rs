//! The report: per-channel tables, latency bands, SLO lines, client overhead, the server's view; as text
//! and as JSON.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::run::RunData;
use crate::scrape::Scrape;
use crate::slo::{check, SloLine, SloResult};
use crate::stats::{
    histogram, ms, series, Channel, ChannelStats, Outcome, Percentiles, Second, Served,
};

/// What the client itself cost.
#[derive(Debug, Clone, Serialize)]
pub struct ClientOverhead {
    /// CPU time of the bench process (user + system), seconds.
    pub cpu_s: f64,
    /// … per request, microseconds.
    pub cpu_us_per_request: f64,
    /// … as a share of one core over the run.
    pub cores_busy: f64,
    /// How late requests left against their intended time (timer + scheduling), ms.
    pub send_lag: Option<Percentiles>,
    /// Requests answered (any status) per second of the run.
    pub achieved_rps: f64,
}

/// One run (one variant under --compare).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub name: String,
    pub settings: Value,
    pub requests: u64,
    pub elapsed_s: f64,
    pub interrupted: bool,
    /// tier0, escalated, degraded, untiered, errors, `stage NAME` per stage that answered, then `served` (all
    /// answers) and `all`.
    pub channels: Vec<ChannelStats>,
    pub slo: Vec<SloResult>,
    /// Requests the bench gave up on, with what the server had sent by then.
    pub gave_up: crate::run::GaveUp,
    /// The client's timeout, seconds.
    pub timeout_s: f64,
    pub client: ClientOverhead,
    pub series: Vec<Second>,
    pub scrape: Scrape,
    /// The variants of a latency experiment, when the server ran one (`x-tiergate-variant`).
    pub variants: Vec<crate::patience::VariantStats>,
    /// What the run's traffic costs (with --cost).
    pub cost: Option<crate::cost::RunCost>,
    /// Answers within their budget (with --deadline-ms).
    pub deadlines: Option<crate::deadlines::DeadlineReport>,
    /// LLM answers by the cascade stage that gave them (`x-tiergate-stage`), by name.
    pub stages: Vec<(String, u64)>,
    /// Answers by the head that classified them (`x-tiergate-head-version`; `none`: an answer that names
    /// none, e.g. a generation), when any answer named one.
    pub heads: Vec<(String, u64)>,
    /// What the operator did (`--feedback`, `--label-audits`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator: Option<crate::operator::Done>,
}

/// Answers per head version (`none` for answers without one), when any names one.
fn by_head(os: &[Outcome]) -> Vec<(String, u64)> {
    let mut m = std::collections::BTreeMap::<&str, u64>::new();
    for o in os.iter().filter(|o| o.error.is_none()) {
        *m.entry(o.head.unwrap_or("none")).or_default() += 1;
    }
    if m.keys().all(|k| *k == "none") {
        return Vec::new();
    }
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Answers per cascade stage, by name.
fn by_stage(os: &[Outcome]) -> Vec<(String, u64)> {
    let mut m = std::collections::BTreeMap::<&str, u64>::new();
    for st in os
        .iter()
        .filter(|o| o.error.is_none())
        .filter_map(|o| o.stage)
    {
        *m.entry(st).or_default() += 1;
    }
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl RunReport {
    pub fn build(
        name: &str,
        settings: Value,
        data: &RunData,
        slo: &[SloLine],
        patience: Option<&crate::patience::Patience>,
    ) -> Self {
        let os = &data.outcomes;
        let total = os.len() as u64;
        let e = data.elapsed_s;
        let mut channels: Vec<ChannelStats> = Channel::ALL
            .iter()
            .map(|&ch| {
                ChannelStats::of(
                    ch.name(),
                    os.iter().filter(move |o| Channel::of(o) == ch),
                    total,
                    e,
                )
            })
            .collect();
        // With the answer cache: every request decided to escalate (the LLM's, the cache's and the degraded
        // answers), the channel a cache shortens.
        if os
            .iter()
            .any(|o| Channel::of(o) == Channel::Served(Served::Cache))
        {
            channels.push(ChannelStats::of(
                "escalations",
                os.iter().filter(|o| {
                    matches!(
                        Channel::of(o),
                        Channel::Served(Served::Escalated)
                            | Channel::Served(Served::Cache)
                            | Channel::Served(Served::Degraded)
                    )
                }),
                total,
                e,
            ));
        }
        // A cascade's or a steered route's stages, each a channel of its own with its band (`stage NAME`).
        for (stage, _) in by_stage(os) {
            channels.push(ChannelStats::of(
                &format!("stage {stage}"),
                os.iter()
                    .filter(|o| o.error.is_none() && o.stage == Some(stage.as_str())),
                total,
                e,
            ));
        }
        channels.push(ChannelStats::of(
            "served",
            os.iter().filter(|o| o.error.is_none()),
            total,
            e,
        ));
        channels.push(ChannelStats::of("all", os.iter(), total, e));
        let slo = check(slo, &channels);
        let lag = histogram(os.iter().map(|o: &Outcome| o.lag_us));
        Self {
            name: name.to_string(),
            settings,
            requests: total,
            elapsed_s: e,
            interrupted: data.interrupted,
            slo,
            gave_up: data.gave_up.clone(),
            timeout_s: data.timeout_s,
            client: ClientOverhead {
                cpu_s: data.client_cpu_s,
                cpu_us_per_request: if total == 0 {
                    0.0
                } else {
                    data.client_cpu_s * 1e6 / total as f64
                },
                cores_busy: data.client_cpu_s / e.max(1e-9),
                send_lag: Percentiles::of(&lag),
                achieved_rps: total as f64 / e.max(1e-9),
            },
            series: series(os),
            variants: crate::patience::variants(os, e, patience),
            cost: None,
            deadlines: crate::deadlines::report(os),
            stages: by_stage(os),
            heads: by_head(os),
            operator: data.operator.clone(),
            scrape: data.scrape.clone(),
            channels,
        }
    }

    /// The operator's part: what it posted and labelled, and the server's silent error and error bound as the
    /// run went (about ten evenly spaced scrapes and the last).
    fn write_quality(&self, s: &mut String) {
        let Some(op) = &self.operator else { return };
        let _ = writeln!(
            s,
            "  operator: {} feedback posted ({} failed), {} audits labelled ({} with a text the workload lacks, {} failed)",
            op.feedback_posted, op.feedback_failed, op.audits_labelled, op.audits_unknown, op.label_failed
        );
        let rows: Vec<(f64, &crate::operator::Quality, Option<f64>)> = self
            .scrape
            .samples
            .iter()
            .filter_map(|x| Some((x.t, x.quality.as_ref()?, x.escalated_share_10s)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "  {:>6} {:>8} {:>22} {:>9} {:>9} {:>9} {:>10}",
            "t (s)",
            "audits",
            "silent error (95% CI)",
            "θ rows",
            "θ audits",
            "θ bound",
            "escalated"
        );
        let step = rows.len().div_ceil(10).max(1);
        let last = rows.len() - 1;
        let f3 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
        for (i, (t, q, esc)) in rows.iter().enumerate() {
            if i % step != 0 && i != last {
                continue;
            }
            let err = match (q.silent_error, q.silent_lower, q.silent_upper) {
                (Some(e), Some(l), Some(u)) => {
                    format!("{} ({}–{})", pct(Some(e)), pct(Some(l)), pct(Some(u)))
                }
                _ => "-".to_string(),
            };
            let _ = writeln!(
                s,
                "  {:>6.0} {:>8} {:>22} {:>9} {:>9} {:>9} {:>10}",
                t,
                q.audits_labelled.map_or("-".to_string(), |n| n.to_string()),
                err,
                f3(q.theta_calibration),
                f3(q.theta_audits),
                f3(q.risk_theta),
                pct(*esc)
            );
        }
    }

    pub fn channel(&self, name: &str) -> Option<&ChannelStats> {
        self.channels.iter().find(|c| c.channel == name)
    }

    /// Escalated + degraded (+ cache hits: escalations that cost no LLM job) over served answers.
    pub fn escalation_share(&self) -> Option<f64> {
        let served = self.channel("served")?.count;
        let cache = self.channel("cache").map_or(0, |c| c.count);
        let esc = self.channel("escalated")?.count + self.channel("degraded")?.count + cache;
        (served > 0).then(|| esc as f64 / served as f64)
    }

    pub fn slo_passed(&self) -> bool {
        self.slo.iter().all(|r| r.pass)
    }

    /// The requests the bench gave up on, each with what the server had sent by then.
    fn write_gave_up(&self, s: &mut String) {
        let g = &self.gave_up;
        if g.count == 0 {
            return;
        }
        let _ = writeln!(
            s,
            "  given up on at the {} s timeout: {} (the first {} named)",
            self.timeout_s,
            g.count,
            g.named.len()
        );
        for t in &g.named {
            let got = match (t.status, t.first_token_s) {
                (0, _) => "no response".to_string(),
                (st, None) => format!("{st}, headers only (tier {})", t.tier.unwrap_or("-")),
                (st, Some(f)) => format!(
                    "{st}, tier {}, {} events, first after {f:.2} s: {:?}",
                    t.tier.unwrap_or("-"),
                    t.events,
                    t.received
                ),
            };
            let _ = writeln!(s, "    at {:.1} s {:?} → {got}", t.at_s, t.sent);
        }
    }

    /// The terminal report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n== {} — {} requests in {:.1} s{} ==",
            self.name,
            self.requests,
            self.elapsed_s,
            if self.interrupted {
                " (interrupted)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "{:<10} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>18} {:>6}  band",
            "channel",
            "count",
            "share",
            "p50 ms",
            "p90",
            "p95",
            "p99",
            "p99.9",
            "mean",
            "req/s",
            "tok/s",
            "dec tok/s",
            "TTFT p50/p99 ms",
            "acc"
        );
        for c in &self.channels {
            if c.count == 0 && !matches!(c.channel.as_str(), "tier0" | "escalated" | "served") {
                continue;
            }
            let l = c.latency.clone().unwrap_or_default();
            let dash = c.latency.is_none();
            let f = |x: f64| if dash { "-".to_string() } else { ms(x) };
            let ttft = c.ttft.as_ref().map_or("-".to_string(), |t| {
                format!("{}/{}", ms(t.p50_ms), ms(t.p99_ms))
            });
            let _ = writeln!(
                s,
                "{:<10} {:>7} {:>5.1}% {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.1} {:>8.1} {:>9} {:>18} {:>6}  {}",
                c.channel,
                c.count,
                c.share * 100.0,
                f(l.p50_ms),
                f(l.p90_ms),
                f(l.p95_ms),
                f(l.p99_ms),
                f(l.p999_ms),
                f(l.mean_ms),
                c.requests_per_s,
                c.tokens_per_s,
                c.decode.as_ref().map_or("-".to_string(), |d| format!("{:.1}", d.p50)),
                ttft,
                c.accuracy.map_or("-".to_string(), |a| format!("{a:.3}")),
                c.band.unwrap_or("-"),
            );
        }
        for c in self
            .channels
            .iter()
            .filter(|c| c.count > 0 && c.channel != "all")
        {
            if let (Some(l), Some(b)) = (&c.latency, c.band) {
                let _ = writeln!(s, "  {} P95 {} ms → {b}", c.channel, ms(l.p95_ms));
            }
        }
        if let Some(d) = self.channel("served").and_then(|c| c.decode.as_ref()) {
            let _ = writeln!(
                s,
                "  decode per generating stream (tokens after the first ÷ time since the first; labels left out): \
                 {} streams, p50 {:.1} / p5 {:.1} / mean {:.1} tok/s",
                d.streams, d.p50, d.p5, d.mean
            );
        }
        if let Some(errs) = self.channel("errors").filter(|c| c.count > 0) {
            let list: Vec<String> = errs
                .errors
                .iter()
                .map(|(k, v)| format!("{k} × {v}"))
                .collect();
            let _ = writeln!(s, "  errors: {}", list.join(", "));
        }
        self.write_gave_up(&mut s);
        s.push_str(&crate::patience::render(&self.variants));
        if let Some(d) = &self.deadlines {
            s.push_str(&crate::deadlines::render(d));
        }
        if let Some(c) = &self.cost {
            s.push_str(&crate::cost::render(c));
        }
        if let Some(share) = self.escalation_share() {
            let _ = writeln!(
                s,
                "  escalation share (escalated + degraded + cache of served): {:.1}%",
                share * 100.0
            );
        }
        if !self.stages.is_empty() {
            let per: Vec<String> = self
                .stages
                .iter()
                .map(|(n, c)| format!("{n} {c}"))
                .collect();
            let _ = writeln!(s, "  LLM answers by stage: {}", per.join(", "));
        }
        if !self.heads.is_empty() {
            let per: Vec<String> = self.heads.iter().map(|(n, c)| format!("{n} {c}")).collect();
            let _ = writeln!(s, "  answers by head: {}", per.join(", "));
        }
        let c = &self.client;
        let _ = writeln!(
            s,
            "  client: {:.1} µs CPU per request ({:.2} cores busy), send lag p50 {} / p99 {} ms, {:.1} req/s achieved",
            c.cpu_us_per_request,
            c.cores_busy,
            c.send_lag.as_ref().map_or("-".into(), |l| ms(l.p50_ms)),
            c.send_lag.as_ref().map_or("-".into(), |l| ms(l.p99_ms)),
            c.achieved_rps
        );
        let sc = &self.scrape;
        if let Some(why) = &sc.unavailable {
            let _ = writeln!(s, "  server view: not scraped ({why})");
        } else if !sc.samples.is_empty() {
            let stat = |f: &dyn Fn(&crate::scrape::Sample) -> Option<f64>| {
                let v: Vec<f64> = sc.samples.iter().filter_map(f).collect();
                if v.is_empty() {
                    return "-".to_string();
                }
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                format!("{min:.2}/{mean:.2}/{max:.2}")
            };
            let _ = writeln!(
                s,
                "  server view (min/mean/max of {} scrapes): θ_eff {}, utilisation {}, queue depth {}",
                sc.samples.len(),
                stat(&|x| x.theta_eff),
                stat(&|x| x.utilization),
                stat(&|x| x.queue_depth),
            );
        }
        self.write_quality(&mut s);
        if !self.slo.is_empty() {
            let _ = writeln!(
                s,
                "  {:<32} {:>10} {:>12} {:>12}  result",
                "SLO", "channel", "target", "measured"
            );
            for r in &self.slo {
                let target = match (r.line.max, r.line.min) {
                    (Some(m), _) => format!("≤ {m}"),
                    (_, Some(m)) => format!("≥ {m}"),
                    _ => "-".into(),
                };
                let _ = writeln!(
                    s,
                    "  {:<32} {:>10} {:>12} {:>12}  {}",
                    r.line.name,
                    r.line.channel,
                    target,
                    r.measured.map_or("-".to_string(), |m| format!("{m:.1}")),
                    r.verdict()
                );
            }
        }
        s
    }
}
