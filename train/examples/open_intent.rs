//! The open-intent protocol on Banking77 (`../shared/data/banking77/train.csv`, read when it is there): 25%,
//! 50% and 75% of the labels known, three seeds each; a frozen MiniLM head per setting; each out-of-scope
//! score's threshold fitted on the known-only dev split for 95% in-scope recall; figures on the test split,
//! beside the published ADB figures (Zhang, Xu & Lin, AAAI 2021, Banking77: accuracy / macro-F1 78.85 / 71.62
//! at 25%, 78.86 / 80.90 at 50%, 81.08 / 85.96 at 75%).
//!
//! `cargo run -p tiergate-train --example open_intent [-- DATA.csv [RECALL]]`

use std::path::PathBuf;
use std::time::Instant;

use tiergate_config::PoolingConfig;
use tiergate_prefilter::classifier::{embed_texts, load_encoder};
use tiergate_train::open_intent;

const ADB: [(f64, f64, f64); 3] = [
    (0.25, 78.85, 71.62),
    (0.50, 78.86, 80.90),
    (0.75, 81.08, 85.96),
];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let data = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/data/banking77/train.csv"));
    let recall: f64 = args.get(1).map_or(Ok(0.95), |r| r.parse())?;
    if !data.is_file() {
        eprintln!(
            "open_intent: {} not found: nothing to measure",
            data.display()
        );
        return Ok(());
    }
    let spec = tiergate_train::data::DataSpec {
        path: data.clone(),
        text_column: "text".into(),
        label_column: "category".into(),
        skip_bad_rows: false,
    };
    let rows = tiergate_train::data::read(&spec)?.examples;
    let mut names: Vec<&str> = rows.iter().map(|e| e.label.as_str()).collect();
    names.sort();
    names.dedup();
    let labels: Vec<usize> = rows
        .iter()
        .filter_map(|e| names.binary_search(&e.label.as_str()).ok())
        .collect();
    let (tokenizer, encoder) = load_encoder(
        &PathBuf::from("models/all-MiniLM-L6-v2"),
        PoolingConfig::Auto,
        128,
    )?;
    let t = Instant::now();
    let texts: Vec<&str> = rows.iter().map(|e| e.text.as_str()).collect();
    let x = embed_texts(&tokenizer, &encoder, &texts, 64)?.to_vec2::<f32>()?;
    eprintln!(
        "open_intent: {} rows, {} labels, embedded in {:.1}s; in-scope recall target {recall}",
        rows.len(),
        names.len(),
        t.elapsed().as_secs_f64()
    );
    println!("| known | method | accuracy | macro-F1 | unknown recall | unknown precision | in-scope accuracy | closed-set accuracy | ADB accuracy / F1 |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (share, adb_acc, adb_f1) in ADB {
        let runs: Vec<open_intent::ProtocolRun> = (1..=3)
            .map(|seed| open_intent::run(&x, &labels, names.len(), share, seed, recall))
            .collect::<Result<_, _>>()?;
        for (m, (name, _)) in runs[0].methods.iter().enumerate() {
            let figs = |f: &dyn Fn(&open_intent::OpenIntentReport) -> Option<f64>| -> String {
                let v: Vec<f64> = runs.iter().filter_map(|r| f(&r.methods[m].1)).collect();
                let mean = v.iter().sum::<f64>() / v.len().max(1) as f64 * 100.0;
                let (lo, hi) = v
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                format!("{mean:.2} ({:.1}–{:.1})", lo * 100.0, hi * 100.0)
            };
            let closed = runs.iter().map(|r| r.closed_accuracy).sum::<f64>() / runs.len() as f64;
            println!(
                "| {:.0}% ({} labels) | {name} | {} | {} | {} | {} | {} | {:.2} | {adb_acc} / {adb_f1} |",
                share * 100.0,
                runs[0].known_labels,
                figs(&|r| Some(r.accuracy)),
                figs(&|r| Some(r.macro_f1)),
                figs(&|r| r.oos_recall),
                figs(&|r| r.oos_precision),
                figs(&|r| r.in_scope_accuracy),
                closed * 100.0,
            );
        }
    }
    Ok(())
}
