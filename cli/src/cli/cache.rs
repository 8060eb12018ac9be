//! `tiergate cache-pairs` (the answer cache's adversarial set: τ chosen on the tune half, figures on the
//! report half, with and without the guards) and `tiergate eval --cache` (labelled rows replayed with a Zipf
//! repetition profile).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tiergate_cache::Guards;
use tiergate_train::cache_eval::{self, Pair, PairFigures};

use super::ConfigArgs;

#[derive(Debug, Args)]
pub struct CachePairsArgs {
    /// The pairs (JSONL: `id`, `kind`, `a`, `b`, `hit`, `half`), e.g. bench/workloads/cache_pairs.jsonl.
    #[arg(long)]
    pub pairs: PathBuf,
    /// A trained head folder; default: the config's `[prefilter]` head (the embedded one without --config).
    #[arg(long)]
    pub classifier: Option<PathBuf>,
    /// False hits allowed as a share of the hits when τ is chosen on the tune half.
    #[arg(long, default_value_t = 0.01)]
    pub max_false_share: f64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// The guards `[cache]` names (the embedded English lists by default).
pub fn guards(cfg: &tiergate_config::Config) -> anyhow::Result<Guards> {
    let words = tiergate_cache::GuardWords::load(cfg.cache.guards.as_deref())?;
    Ok(Guards::new(&words)?)
}

pub fn run_pairs(
    args: &CachePairsArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    let cfg = tiergate_config::load(args.config.config.as_deref(), env, &args.config.overrides)?;
    let text = std::fs::read_to_string(&args.pairs)
        .with_context(|| format!("reading {}", args.pairs.display()))?;
    let pairs: Vec<Pair> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {}", i + 1)))
        .collect::<anyhow::Result<_>>()?;
    let classifier = match &args.classifier {
        Some(dir) => super::hybrid::load_classifier(dir, &cfg)?,
        None => tiergate_prefilter::Classifier::from_config(&cfg.prefilter)?,
    };
    let texts: Vec<String> = pairs
        .iter()
        .flat_map(|p| [p.a.clone(), p.b.clone()])
        .collect();
    let seen = cache_eval::observe(classifier, &texts, &cfg.prefilter)?;
    let (a, b): (Vec<_>, Vec<_>) = seen.chunks(2).map(|c| (c[0].clone(), c[1].clone())).unzip();
    let guards = guards(&cfg)?;
    let measured = cache_eval::measure(&pairs, &a, &b, &guards);
    let mut out = Vec::new();
    for g in [true, false] {
        let tau = cache_eval::choose_tau(&measured, g, args.max_false_share).unwrap_or(1.0);
        out.push((
            g,
            tau,
            cache_eval::figures(&measured, "tune", tau, g),
            cache_eval::figures(&measured, "report", tau, g),
        ));
    }
    // The same τ with and without the guards: what the guards alone buy.
    let tau_g = out[0].1;
    let report_at_tau_g_unguarded = cache_eval::figures(&measured, "report", tau_g, false);
    let config_tau = cfg.cache.tau;
    let at_config = (
        cache_eval::figures(&measured, "report", config_tau, true),
        cache_eval::figures(&measured, "report", config_tau, false),
    );
    if args.json {
        let rows: Vec<_> = out
            .iter()
            .map(|(g, tau, t, r)| serde_json::json!({"guards": g, "tau": tau, "tune": t, "report": r}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"pairs": pairs.len(), "chosen": rows,
                "report_at_guarded_tau_without_guards": report_at_tau_g_unguarded,
                "config_tau": config_tau, "report_at_config_tau": [at_config.0, at_config.1],
                "guards_cover": guards.covers()})
        );
        return Ok(());
    }
    println!(
        "{} pairs; τ chosen on the tune half (lowest τ with no false hit on negation/number pairs and false \
         hits ≤ {:.0}% of hits); figures on the report half",
        pairs.len(),
        args.max_false_share * 100.0
    );
    println!("guards  τ      half    paraphrase hits   false hits (negation number antonym entity topic)   false/hits");
    for (_, _, t, r) in &out {
        print_row(t, "tune");
        print_row(r, "report");
    }
    print_row(&report_at_tau_g_unguarded, "report");
    println!("at the config's τ = {config_tau}:");
    print_row(&at_config.0, "report");
    print_row(&at_config.1, "report");
    Ok(())
}

fn print_row(f: &PairFigures, half: &str) {
    let kind = |k: &str| {
        f.false_hits
            .iter()
            .find(|(n, _, _)| n == k)
            .map_or("-".to_string(), |(_, x, n)| format!("{x}/{n}"))
    };
    println!(
        "{:<7} {:<6.2} {:<7} {:>3}/{:<3} ({:>5.1}%)   {:>7} {:>7} {:>7} {:>7} {:>7}   {:>3}/{:<3} ({:.1}%)",
        if f.guards { "on" } else { "off" },
        f.tau,
        half,
        f.paraphrase_hits,
        f.paraphrases,
        f.hit_rate() * 100.0,
        kind("negation"),
        kind("number"),
        kind("antonym"),
        kind("entity"),
        kind("topic"),
        f.false_total,
        f.hits,
        f.false_share() * 100.0
    );
}

/// `tiergate eval --cache`: `rows` replayed with a Zipf profile, with the exact cache alone and with the
/// semantic one.
/// What `eval --cache` replays with.
pub struct ReplayArgs {
    pub json: bool,
    pub cache_requests: usize,
    pub zipf_s: f64,
    pub cache_theta: f64,
    pub cache_tau: Option<f32>,
    pub seed: u64,
}

pub fn run_replay(
    args: &ReplayArgs,
    cfg: &tiergate_config::Config,
    classifier: tiergate_prefilter::Classifier,
    rows: &[tiergate_train::data::Example],
) -> anyhow::Result<()> {
    let labels: Vec<String> = classifier.labels().to_vec();
    let texts: Vec<String> = rows.iter().map(|r| r.text.clone()).collect();
    let seen = cache_eval::observe(classifier, &texts, &cfg.prefilter)?;
    let gold: Vec<usize> = rows
        .iter()
        .map(|r| {
            labels
                .iter()
                .position(|l| *l == r.label)
                .unwrap_or(usize::MAX)
        })
        .collect();
    let guards = guards(cfg)?;
    let tau = args.cache_tau.unwrap_or(cfg.cache.tau);
    let reports: Vec<_> = [false, true]
        .into_iter()
        .map(|semantic| {
            cache_eval::replay(
                &seen,
                &gold,
                &guards,
                args.cache_requests,
                args.zipf_s,
                args.cache_theta,
                tau,
                cfg.cache.bucket_cap,
                semantic,
                args.seed,
            )
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
        return Ok(());
    }
    println!(
        "{} requests over {} rows, Zipf s = {}, θ = {}, τ = {tau}; fresh verdict = the gold label (a perfect judge)",
        args.cache_requests,
        rows.len(),
        args.zipf_s,
        args.cache_theta
    );
    println!("cache      escalated  exact  semantic  hit rate  false hits (of semantic)  LLM jobs  lookup p50/p99 µs");
    for r in &reports {
        let hits = r.exact_hits + r.semantic_hits;
        println!(
            "{:<10} {:>9} {:>6} {:>9} {:>8.1}% {:>7} ({}/{}) {:>14} {:>8.1}/{:.1}",
            if r.semantic { "semantic" } else { "exact" },
            r.escalated,
            r.exact_hits,
            r.semantic_hits,
            hits as f64 / r.escalated.max(1) as f64 * 100.0,
            r.false_hits,
            r.semantic_false_hits,
            r.semantic_hits,
            r.llm_jobs,
            r.lookup_p50_us,
            r.lookup_p99_us
        );
    }
    Ok(())
}
