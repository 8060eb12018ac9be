//! `tiergate-bench slo derive`: from a business SLA (end-to-end P95) to the model's P95 budget, its latency
//! band, and an SLO file the bench's `--slo` checks.
//!
//! budget = (SLA − overhead) × (1 − margin): the overhead is everything that is not model time (network,
//! HTTP, routing, queueing), given or measured from a bench run's JSON (per request: end to end minus the
//! server's `Server-Timing: model;dur=`; its P95); the margin absorbs tail amplification (P95s do not add up).

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::stats::band;

/// `slo derive` arguments.
#[derive(Debug, Clone, Args)]
pub struct DeriveArgs {
    /// The business SLA: end-to-end P95, milliseconds.
    #[arg(long)]
    pub sla_p95_ms: f64,
    /// The non-model overhead's P95, milliseconds (or measure it with --from-run).
    #[arg(
        long,
        required_unless_present = "from_run",
        conflicts_with = "from_run"
    )]
    pub overhead_ms: Option<f64>,
    /// A bench run's JSON (`--json`): the overhead is that run's measured P95 of non-model time.
    #[arg(long)]
    pub from_run: Option<PathBuf>,
    /// Which run of a `--compare` report (default: the first).
    #[arg(long, requires = "from_run")]
    pub run: Option<String>,
    /// The channel the SLO is for: served (every answer), tier0, escalated, degraded.
    #[arg(long, default_value = "served")]
    pub channel: String,
    /// The route the SLO is for (checked against the run's route; named in the file).
    #[arg(long)]
    pub route: Option<String>,
    /// Safety margin for tail amplification, in [0, 1).
    #[arg(long, default_value_t = 0.15)]
    pub margin: f64,
    /// A minimum throughput the SLO also asks for (requests per second, all channels).
    #[arg(long)]
    pub min_qps: Option<f64>,
    /// A resource ceiling: the most of the traffic the LLM may take (the escalated share).
    #[arg(long)]
    pub max_escalated_share: Option<f64>,
    /// An error budget: the most of the traffic that may fail.
    #[arg(long)]
    pub max_error_share: Option<f64>,
    /// Write the SLO file here (default: print it).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// A derivation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Derivation {
    pub sla_p95_ms: f64,
    pub overhead_ms: f64,
    /// `given`, or where it was measured.
    pub overhead_source: String,
    pub margin: f64,
    /// The model's P95 budget.
    pub budget_ms: f64,
    /// The budget's latency band.
    pub band: &'static str,
    pub channel: String,
    pub route: Option<String>,
}

/// budget = (SLA − overhead) × (1 − margin), rounded to 0.1 ms; an error when nothing is left for the model.
pub fn budget(sla_p95_ms: f64, overhead_ms: f64, margin: f64) -> Result<f64, String> {
    if !sla_p95_ms.is_finite() || sla_p95_ms <= 0.0 {
        return Err(format!("SLA P95 {sla_p95_ms} ms: must be positive"));
    }
    if !overhead_ms.is_finite() || overhead_ms < 0.0 {
        return Err(format!("overhead {overhead_ms} ms: must be ≥ 0"));
    }
    if !(0.0..1.0).contains(&margin) {
        return Err(format!("margin {margin}: must be in [0, 1)"));
    }
    if overhead_ms >= sla_p95_ms {
        return Err(format!(
            "the overhead ({overhead_ms} ms) takes the whole SLA ({sla_p95_ms} ms): no budget is left for the \
             model; cut the overhead or renegotiate the SLA"
        ));
    }
    Ok(((sla_p95_ms - overhead_ms) * (1.0 - margin) * 10.0).round() / 10.0)
}

/// The P95 of non-model time of `channel` in a bench report (`run`: by name, else the first run).
pub fn measured_overhead(
    report: &Value,
    run: Option<&str>,
    channel: &str,
    route: Option<&str>,
) -> Result<f64, String> {
    let runs = report["runs"]
        .as_array()
        .ok_or("not a tiergate-bench report (no `runs`)")?;
    let r = match run {
        Some(name) => runs
            .iter()
            .find(|r| r["name"] == name)
            .ok_or_else(|| format!("no run named `{name}` in the report"))?,
        None => runs.first().ok_or("the report has no runs")?,
    };
    let measured_route = r["settings"]["route"].as_str().or(report["route"].as_str());
    if let (Some(want), Some(got)) = (route, measured_route) {
        if want != got {
            return Err(format!("the run measured route `{got}`, not `{want}`"));
        }
    }
    let c = r["channels"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["channel"] == channel))
        .ok_or_else(|| format!("the run has no `{channel}` channel"))?;
    c["overhead"]["p95_ms"].as_f64().ok_or_else(|| {
        format!(
            "the run's `{channel}` channel has no model time (the server sent no `Server-Timing: model;dur=`, \
             or the channel is empty); give --overhead-ms"
        )
    })
}

/// Runs `slo derive`: the derivation, and the SLO file's text.
pub fn run(a: &DeriveArgs) -> Result<(Derivation, String), String> {
    const CHANNELS: &[&str] = &["served", "all", "tier0", "escalated", "degraded"];
    if !CHANNELS.contains(&a.channel.as_str()) {
        return Err(format!(
            "--channel {}: use one of {}",
            a.channel,
            CHANNELS.join(", ")
        ));
    }
    let (overhead_ms, overhead_source) = match (&a.from_run, a.overhead_ms) {
        (Some(p), _) => {
            let raw = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v: Value =
                serde_json::from_slice(&raw).map_err(|e| format!("{}: {e}", p.display()))?;
            let o = measured_overhead(&v, a.run.as_deref(), &a.channel, a.route.as_deref())?;
            (
                o,
                format!("measured: P95 of non-model time in {}", p.display()),
            )
        }
        (None, Some(o)) => (o, "given".to_string()),
        (None, None) => return Err("give --overhead-ms or --from-run".into()),
    };
    for (name, v) in [
        ("--max-escalated-share", a.max_escalated_share),
        ("--max-error-share", a.max_error_share),
    ] {
        if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            return Err(format!("{name}: a share in [0, 1]"));
        }
    }
    if a.min_qps.is_some_and(|q| !q.is_finite() || q <= 0.0) {
        return Err("--min-qps: a positive rate".into());
    }
    let budget_ms = budget(a.sla_p95_ms, overhead_ms, a.margin)?;
    let d = Derivation {
        sla_p95_ms: a.sla_p95_ms,
        overhead_ms,
        overhead_source,
        margin: a.margin,
        budget_ms,
        band: band(budget_ms),
        channel: a.channel.clone(),
        route: a.route.clone(),
    };
    let text = slo_file(&d, a);
    Ok((d, text))
}

/// The SLO file: the model's budget, the SLA itself end to end, and the optional floor and ceilings.
pub fn slo_file(d: &Derivation, a: &DeriveArgs) -> String {
    let who = match &d.route {
        Some(r) => format!("{} ({r})", d.channel),
        None => d.channel.clone(),
    };
    let mut s = format!(
        "# Derived by `tiergate-bench slo derive`: SLA P95 {sla} ms end to end, non-model overhead {o} ms \
         ({src}),\n# margin {m}: model budget = ({sla} − {o}) × (1 − {m}) = {b} ms → {band}.\n",
        sla = d.sla_p95_ms,
        o = d.overhead_ms,
        src = d.overhead_source,
        m = d.margin,
        b = d.budget_ms,
        band = d.band,
    );
    let mut line = |name: String, channel: &str, metric: &str, bound: &str, v: f64| {
        s.push_str(&format!(
            "\n[[slo]]\nname = {name:?}\nchannel = \"{channel}\"\nmetric = \"{metric}\"\n{bound} = {v}\n"
        ));
    };
    line(
        format!("{who}: model P95 ≤ {} ms ({})", d.budget_ms, d.band),
        &d.channel,
        "model_p95_ms",
        "max",
        d.budget_ms,
    );
    line(
        format!("{who}: end-to-end P95 ≤ {} ms (the SLA)", d.sla_p95_ms),
        &d.channel,
        "p95_ms",
        "max",
        d.sla_p95_ms,
    );
    if let Some(q) = a.min_qps {
        line(
            format!("throughput ≥ {q} req/s"),
            "all",
            "requests_per_s",
            "min",
            q,
        );
    }
    if let Some(x) = a.max_escalated_share {
        line(
            format!("LLM ceiling: escalated share ≤ {x}"),
            "escalated",
            "share",
            "max",
            x,
        );
    }
    if let Some(x) = a.max_error_share {
        line(
            format!("error budget: errors ≤ {x}"),
            "errors",
            "share",
            "max",
            x,
        );
    }
    s
}

/// The derivation as text.
pub fn render(d: &Derivation) -> String {
    format!(
        "SLA P95 {} ms, overhead {} ms ({}), margin {}\nmodel P95 budget = ({} − {}) × (1 − {}) = {} ms → {}\n",
        d.sla_p95_ms,
        d.overhead_ms,
        d.overhead_source,
        d.margin,
        d.sla_p95_ms,
        d.overhead_ms,
        d.margin,
        d.budget_ms,
        d.band
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(overhead: f64) -> DeriveArgs {
        DeriveArgs {
            sla_p95_ms: 800.0,
            overhead_ms: Some(overhead),
            from_run: None,
            run: None,
            channel: "escalated".into(),
            route: None,
            margin: 0.15,
            min_qps: Some(50.0),
            max_escalated_share: Some(0.2),
            max_error_share: Some(0.001),
            out: None,
        }
    }

    #[test]
    fn the_worked_example() {
        // (800 − 320) × (1 − 0.15) = 408 ms: Tier-2.
        assert_eq!(budget(800.0, 320.0, 0.15), Ok(408.0));
        let (d, text) = run(&args(320.0)).unwrap();
        assert_eq!(d.budget_ms, 408.0);
        assert_eq!(d.band, "Tier-2");
        // The file is one the bench's --slo reads, with the budget, the SLA and the floor and ceilings.
        let lines = crate::slo::parse(&text).unwrap();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0].metric, crate::slo::Metric::ModelP95Ms);
        assert_eq!(
            (lines[0].channel.as_str(), lines[0].max),
            ("escalated", Some(408.0))
        );
        assert_eq!(lines[1].metric, crate::slo::Metric::P95Ms);
        assert_eq!(lines[1].max, Some(800.0));
        assert_eq!(
            (lines[2].channel.as_str(), lines[2].min),
            ("all", Some(50.0))
        );
        assert_eq!(
            (lines[3].channel.as_str(), lines[3].max),
            ("escalated", Some(0.2))
        );
        assert_eq!(
            (lines[4].channel.as_str(), lines[4].max),
            ("errors", Some(0.001))
        );
        assert!(
            text.contains("(800 − 320) × (1 − 0.15) = 408 ms → Tier-2"),
            "{text}"
        );
    }

    #[test]
    fn bands_and_refusals() {
        assert_eq!(budget(100.0, 10.0, 0.15), Ok(76.5)); // Tier-0
        assert_eq!(budget(10_000.0, 500.0, 0.0), Ok(9500.0)); // Tier-4
        assert!(budget(300.0, 300.0, 0.1).unwrap_err().contains("no budget"));
        assert!(budget(300.0, 10.0, 1.0).is_err());
        assert!(budget(-1.0, 0.0, 0.1).is_err());
        assert!(budget(300.0, -5.0, 0.1).is_err());
        let mut a = args(320.0);
        a.channel = "tier9".into();
        assert!(run(&a).unwrap_err().contains("--channel"));
    }

    #[test]
    fn overhead_measured_from_a_report() {
        let report = json!({"route": "classify", "runs": [
            {"name": "run", "settings": {"route": "classify"}, "channels": [
                {"channel": "served", "overhead": {"p95_ms": 12.5}},
                {"channel": "escalated", "overhead": {"p95_ms": 41.0}},
                {"channel": "tier0", "overhead": null}]},
            {"name": "hybrid-load", "settings": {"route": "classify"}, "channels": [
                {"channel": "escalated", "overhead": {"p95_ms": 55.0}}]}]});
        assert_eq!(
            measured_overhead(&report, None, "escalated", None),
            Ok(41.0)
        );
        assert_eq!(
            measured_overhead(&report, Some("hybrid-load"), "escalated", Some("classify")),
            Ok(55.0)
        );
        assert!(measured_overhead(&report, None, "tier0", None)
            .unwrap_err()
            .contains("no model time"));
        assert!(measured_overhead(&report, None, "served", Some("answer"))
            .unwrap_err()
            .contains("not `answer`"));
        assert!(measured_overhead(&report, Some("x"), "served", None).is_err());
    }
}
