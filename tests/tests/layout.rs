//! The crates' dependencies run one way (`cargo metadata` of the workspace): the rules the layout promises,
//! checked on the resolved graph (normal dependencies, transitively), so a new `use` across a line fails here
//! and not in review.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::{HashMap, HashSet};
use std::process::Command;

use tiergate_tests::root;

/// Package name → the names of its normal (non-dev, non-build) dependencies.
fn graph() -> HashMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // This machine's platform only: the other platforms' dependencies need not be downloaded.
    let rustc = Command::new("rustc").arg("-vV").output().unwrap();
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .unwrap();
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: HashMap<&str, &str> = v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut g: HashMap<String, Vec<String>> = HashMap::new();
    for node in v["resolve"]["nodes"].as_array().unwrap() {
        let from = names[node["id"].as_str().unwrap()].to_string();
        let deps = g.entry(from).or_default();
        for d in node["deps"].as_array().unwrap() {
            let normal = d["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                deps.push(names[d["pkg"].as_str().unwrap()].to_string());
            }
        }
    }
    g
}

/// Every package `from` reaches through normal dependencies.
fn reaches(g: &HashMap<String, Vec<String>>, from: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(p) = todo.pop() {
        for d in g.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn dependencies_run_one_way() {
    let g = graph();
    let server = reaches(&g, "tiergate-server");
    assert!(
        !server.contains("mistralrs"),
        "the server compiles mistralrs: the LLM runs in the worker process"
    );
    assert!(!server.contains("tiergate-reranker"));
    // The HTTP server is one product: the Batch API (SQLite) and the offline CLI (training) live apart.
    for banned in [
        "rusqlite",
        "tiergate-batch",
        "tiergate-train",
        "tiergate-cli",
    ] {
        assert!(
            !server.contains(banned),
            "the server depends on {banned}: it belongs to another product"
        );
    }
    let batch = reaches(&g, "tiergate-batch");
    assert!(batch.contains("tiergate-server") && !batch.contains("tiergate-train"));
    let cli = &g["tiergate-cli"];
    for part in ["tiergate-server", "tiergate-batch", "tiergate-train"] {
        assert!(cli.iter().any(|d| d == part), "the cli composes {part}");
    }
    let worker = reaches(&g, "tiergate-reranker");
    for banned in ["tiergate-prefilter", "tiergate-train", "tiergate-server"] {
        assert!(
            !worker.contains(banned),
            "the worker depends on {banned}: it needs the kernels, not Tier-0"
        );
    }
    assert!(
        !g["tiergate-reranker"].iter().any(|d| d == "csv"),
        "the worker depends on csv directly"
    );
    // Serving is apart from training: Tier-0 reads no CSV and reaches no training code.
    let prefilter = reaches(&g, "tiergate-prefilter");
    assert!(!prefilter.contains("tiergate-train"));
    assert!(
        !g["tiergate-prefilter"].iter().any(|d| d == "csv"),
        "the prefilter depends on csv: data files belong to tiergate-train"
    );
    for leaf in ["tiergate-kernels", "tiergate-core"] {
        let r = reaches(&g, leaf);
        assert!(
            !r.iter().any(|d| d.starts_with("tiergate-")),
            "{leaf} depends on {r:?}"
        );
    }
    for lower in [
        "tiergate-train",
        "tiergate-config",
        "tiergate-queue",
        "tiergate-telemetry",
        "tiergate-prefilter",
    ] {
        let r = reaches(&g, lower);
        assert!(
            !r.contains("tiergate-server")
                && !r.contains("tiergate-reranker")
                && !r.contains("tiergate-cli"),
            "{lower} depends on a product crate"
        );
    }
}

/// Package → its enabled features, from `cargo tree` over the workspace with the given edge kinds.
fn features(edges: &str) -> HashMap<String, HashSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--workspace", "--prefix", "none"])
        .args(["-e", edges, "-f", "{p}|{f}"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m: HashMap<String, HashSet<String>> = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.replace(" (*)", "");
        let Some((pkg, f)) = line.split_once('|') else {
            continue;
        };
        m.entry(pkg.trim().to_string()).or_default().extend(
            f.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from),
        );
    }
    m
}

/// The binaries' build (`scripts/tiergate`: `cargo build --bins`) and the test build (`scripts/test.sh`) turn
/// on the same features in every shared dependency, so the second reuses everything the first compiled (a
/// difference in one low crate recompiles everything above it, mistralrs included). A new difference goes into
/// `hack/Cargo.toml`.
#[test]
fn the_binaries_and_the_tests_build_shared_dependencies_alike() {
    let bins = features("normal,build");
    let all = features("normal,build,dev");
    assert!(
        bins.len() > 100,
        "cargo tree listed {} packages",
        bins.len()
    );
    let differ: Vec<String> = bins
        .iter()
        .filter_map(|(p, f)| {
            let extra: Vec<&String> = all.get(p)?.difference(f).collect();
            (!extra.is_empty()).then(|| format!("{p}: the tests add {extra:?}"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "pin these in hack/Cargo.toml: {differ:#?}"
    );
}
