//! The crates' dependencies run one way (`cargo metadata` of the workspace): the rules the layout promises,
//! checked on the resolved graph (normal dependencies, transitively), so a new `use` across a line fails here
//! and not in review.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::{HashMap, HashSet};
use std::process::Command;

use tiergate_tests::root;

/// The standard output of `cargo ARGS` in the workspace root (the test fails with its standard error).
fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Package name → the names of its normal (non-dev, non-build) dependencies.
fn graph() -> HashMap<String, Vec<String>> {
    // This machine's platform only: the other platforms' dependencies need not be downloaded.
    let rustc = Command::new("rustc").arg("-vV").output().unwrap();
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .unwrap();
    let out = cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--offline",
        "--filter-platform",
        &host,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
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
    // The engine speaks no HTTP: the server is its HTTP adapter, and the batch runner and the CLI drive it
    // without a listener.
    let engine = reaches(&g, "tiergate-engine");
    assert!(
        !engine.contains("axum") && !engine.contains("tiergate-server"),
        "the engine reaches axum or the server"
    );
    for http in [
        "hyper",
        "hyper-util",
        "tower",
        "http",
        "http-body",
        "http-body-util",
    ] {
        assert!(
            !g["tiergate-engine"].iter().any(|d| d == http),
            "the engine depends on {http} directly"
        );
    }
    assert!(g["tiergate-server"].iter().any(|d| d == "tiergate-engine"));
    // The local ledger is a store the binary hands the engine: it reaches neither the server nor axum.
    let feedback = reaches(&g, "tiergate-feedback");
    assert!(
        !feedback.contains("tiergate-server") && !feedback.contains("axum"),
        "the feedback crate reaches the server or axum"
    );
    // The Batch API and the server meet only through the engine's traits (engine/src/batch.rs): the batch
    // crate reaches neither the server nor axum, and the cli wires the one into the other.
    let batch = reaches(&g, "tiergate-batch");
    for banned in ["tiergate-server", "axum", "tiergate-train"] {
        assert!(!batch.contains(banned), "the batch crate reaches {banned}");
    }
    assert!(g["tiergate-batch"].iter().any(|d| d == "tiergate-engine"));
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

/// The server crate is the HTTP adapter: every source file speaks HTTP (axum, hyper, headers, status codes)
/// or is the OpenAI wire format; what a request goes through between the edge and the models lives in
/// `tiergate-engine`.
/// The code of a Rust file: comments (line, doc, nested block) and the contents of string, byte-string, raw
/// string and char literals blanked out, so a rule about code is not satisfied by a word in prose.
fn code_of(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    let at = |i: usize| b.get(i).copied().unwrap_or('\0');
    while i < b.len() {
        let c = b[i];
        if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    (depth, i) = (depth + 1, i + 2);
                } else if b[i] == '*' && at(i + 1) == '/' {
                    (depth, i) = (depth - 1, i + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (at(i + 1) == '#' || at(i + 1) == '"')
            && !ident(at(i.wrapping_sub(1)))
        {
            // A raw string: r"…", r#"…"#, br#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                (hashes, j) = (hashes + 1, j + 1);
            }
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && (at(i + 2) == '\'' || (at(i + 1) == '\\' && at(i + 3) == '\'')) {
            // A char literal ('x', '\n'); a lifetime ('a) is code and stays.
            i += if at(i + 1) == '\\' { 4 } else { 3 };
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifiers of a piece of code, in order.
fn identifiers(code: &str) -> Vec<&str> {
    code.split(|c: char| !ident(c))
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn code_of_drops_prose_and_keeps_code() {
    let text = "// axum here\n/// StatusCode\n/* a /* nested */ hyper */ let s = \"axum\"; let r = r#\"HeaderMap\"#;\nlet c = '\"'; fn f<'a>(x: &'a u8) {}\nuse axum::Router;";
    let code = code_of(text);
    let ids = identifiers(&code);
    assert_eq!(ids.iter().filter(|w| **w == "axum").count(), 1, "{code}");
    assert!(!ids.contains(&"StatusCode") && !ids.contains(&"hyper") && !ids.contains(&"HeaderMap"));
    assert!(code.contains("fn f<'a>(x: &'a u8)"), "{code}");
}

/// The server crate is the HTTP door: every file of it (but the OpenAI wire types) uses an HTTP type in its
/// code. A file that does not belongs to the engine. A word in a comment or a string does not count.
#[test]
fn the_server_crate_holds_http_only() {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("server/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 10, "{files:?}");
    // The OpenAI wire formats (Chat Completions in openai.rs, Responses in openai_responses.rs) are the
    // HTTP API's types without HTTP calls in them.
    let wire = |f: &std::path::Path| {
        f.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with("openai") && f.parent() == Some(&root().join("server/src"))
        })
    };
    let speaks_http = |text: &str| {
        let code = code_of(text);
        identifiers(&code)
            .iter()
            .any(|w| ["axum", "hyper", "HeaderMap", "StatusCode"].contains(w))
    };
    // The crate root only names its modules.
    let only_modules = |text: &str| {
        code_of(text)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .all(|l| l.starts_with("pub mod ") || l.starts_with("mod ") || l.starts_with("#!"))
    };
    let apart: Vec<_> = files
        .iter()
        .filter(|f| !wire(f))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            !speaks_http(&text) && !only_modules(&text)
        })
        .collect();
    assert!(
        apart.is_empty(),
        "server files with no HTTP in them (they belong to tiergate-engine): {apart:?}"
    );
    // A door runs no step of the pipeline: no server file names the queue (jobs, slots, events) or the answer
    // cache; it hands a validated request to the engine and renders the value it gets back.
    let pipeline = |text: &str| {
        let code = code_of(text);
        identifiers(&code)
            .iter()
            .any(|w| ["tiergate_queue", "tiergate_cache"].contains(w))
    };
    let runs_pipeline: Vec<_> = files
        .iter()
        .filter(|f| pipeline(&std::fs::read_to_string(f).unwrap()))
        .collect();
    assert!(
        runs_pipeline.is_empty(),
        "server files that reach past the engine into the queue or the cache: {runs_pipeline:?}"
    );
    assert!(pipeline("use tiergate_queue::Job;") && !pipeline("// tiergate_queue"));
    // The batch runner has the engine answer its lines: no in-process HTTP round trip through the router.
    for f in ["batch/src/runner.rs", "batch/src/lib.rs"] {
        let code = code_of(&std::fs::read_to_string(root().join(f)).unwrap());
        assert!(
            !identifiers(&code).contains(&"oneshot"),
            "{f} sends requests through the router (oneshot)"
        );
    }
    // The check tells: the engine's files speak none, and prose naming axum is not HTTP.
    let engine_state = std::fs::read_to_string(root().join("engine/src/state.rs")).unwrap();
    assert!(!speaks_http(&engine_state));
    assert!(!speaks_http(
        "//! Served by axum, answers with a StatusCode.\nfn f() -> &'static str { \"axum\" }"
    ));
    assert!(speaks_http("fn f() -> axum::http::StatusCode { todo!() }"));
}

/// Whether code reads the `[reranker]` section: a field access `.reranker` (then `.x`, `;`, `,`, `)`, or
/// anything else), in code, not in comments or strings.
fn reads_reranker(text: &str) -> bool {
    let code = code_of(text);
    code.match_indices(".reranker").any(|(i, m)| {
        let next = code[i + m.len()..].chars().next().unwrap_or(' ');
        !ident(next)
    })
}

/// `[reranker]` is read in one place: `Config::resolve` merges it into every backend, and every other crate's
/// code reads the resolved backends (a second reader is how a route once used `[reranker]`'s candidates
/// instead of its own backend's). Tests and examples (outside `src/`, or a `src/` module of tests only,
/// `*_tests.rs`) may set its fields to build a config.
#[test]
fn no_crate_but_config_reads_the_reranker_section() {
    let mut offenders = Vec::new();
    let mut checked = 0;
    for krate in std::fs::read_dir(root()).unwrap().flatten() {
        if krate.file_name() == "config" || !krate.path().join("Cargo.toml").is_file() {
            continue;
        }
        let mut dirs = vec![krate.path().join("src")];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs")
                    && !p.to_string_lossy().ends_with("_tests.rs")
                {
                    checked += 1;
                    if reads_reranker(&std::fs::read_to_string(&p).unwrap()) {
                        offenders.push(p);
                    }
                }
            }
        }
    }
    assert!(checked > 120, "only {checked} files checked");
    assert!(
        offenders.is_empty(),
        "these read [reranker] past Config::resolve: {offenders:?}"
    );
    // The check tells: the config crate reads it, every form of the access counts, prose does not.
    let lib = std::fs::read_to_string(root().join("config/src/resolve.rs")).unwrap();
    assert!(reads_reranker(&lib));
    for code in [
        "let r = &cfg.reranker;",
        "f(cfg.reranker)",
        "let w = cfg.reranker.workers;",
        "let r = cfg.reranker.clone();",
        "match c.reranker { _ => () }",
    ] {
        assert!(reads_reranker(code), "{code}");
    }
    for prose in [
        "// cfg.reranker; is read once",
        "let s = \"cfg.reranker\";",
        "use tiergate_reranker::x;",
        "let n = cfg.reranker_count;",
    ] {
        assert!(!reads_reranker(prose), "{prose}");
    }
}

/// Package → its enabled features, from `cargo tree` over the workspace with the given edge kinds.
fn features(edges: &str) -> HashMap<String, HashSet<String>> {
    features_of("--workspace", edges)
}

/// [`features`] for a selection of packages (`--workspace`, `-ptiergate-cli`).
fn features_of(selection: &str, edges: &str) -> HashMap<String, HashSet<String>> {
    let out = cargo(&[
        "tree",
        "--offline",
        selection,
        "--prefix",
        "none",
        "-e",
        edges,
        "-f",
        "{p}|{f}",
    ]);
    let mut m: HashMap<String, HashSet<String>> = HashMap::new();
    for line in String::from_utf8_lossy(&out).lines() {
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
    same_features(
        &features("normal,build"),
        &features("normal,build,dev"),
        "the tests",
    );
}

/// `scripts/tiergate` serves as soon as cargo has linked `tiergate`, and a build of `-p tiergate-cli` alone
/// must not compile shared dependencies with other features than the workspace build (the worker's
/// dependencies turn on more in crates `tiergate` shares): else the workspace build after it recompiles them
/// and everything above. A new difference goes into `hack/Cargo.toml`.
#[test]
fn the_server_alone_and_the_workspace_build_shared_dependencies_alike() {
    let server = features_of("-ptiergate-cli", "normal,build");
    same_features(&server, &features("normal,build"), "the workspace");
}

/// Fails naming every package of `base` to which `wider` (the build `who` describes) adds features.
fn same_features(
    base: &HashMap<String, HashSet<String>>,
    wider: &HashMap<String, HashSet<String>>,
    who: &str,
) {
    assert!(
        base.len() > 100,
        "cargo tree listed {} packages",
        base.len()
    );
    let differ: Vec<String> = base
        .iter()
        .filter_map(|(p, f)| {
            let extra: Vec<&String> = wider.get(p)?.difference(f).collect();
            (!extra.is_empty()).then(|| format!("{p}: {extra:?} turned on by {who}"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "pin these in hack/Cargo.toml: {differ:#?}"
    );
}

/// A crate's source files as modules (`routes::chat`), each with the modules of its own crate it names
/// (`crate::…` and `super::…` paths outside comments and test modules).
fn module_graph(src: &std::path::Path) -> HashMap<String, HashSet<String>> {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut paths = Vec::new();
    files(src, &mut paths);
    let name = |p: &std::path::Path| {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let m = rel.to_string_lossy().replace("/mod", "").replace('/', "::");
        if m == "lib" || m == "main" {
            "crate".to_string()
        } else {
            m
        }
    };
    let mods: HashSet<String> = paths.iter().map(|p| name(p)).collect();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == ':')
            .collect::<String>()
            .trim_end_matches(':')
            .to_string()
    };
    let mut g = HashMap::new();
    for p in &paths {
        let m = name(p);
        let text = std::fs::read_to_string(p).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let parent = m.rsplit_once("::").map_or("", |(a, _)| a).to_string();
        let mut refs = HashSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (prefix, base) in [("crate::", String::new()), ("super::", parent.clone())] {
                for (i, _) in line.match_indices(prefix) {
                    let path = ident(&line[i + prefix.len()..]);
                    let full = if base.is_empty() {
                        path
                    } else {
                        format!("{base}::{path}")
                    };
                    // The longest module the path names (`routes::chat::Meta` → `routes::chat`).
                    let mut cand = full.as_str();
                    loop {
                        if mods.contains(cand) {
                            refs.insert(cand.to_string());
                            break;
                        }
                        match cand.rsplit_once("::") {
                            Some((a, _)) => cand = a,
                            None => break,
                        }
                    }
                }
            }
        }
        refs.retain(|r| *r != m && !r.starts_with(&format!("{m}::")) && r != "crate");
        g.insert(m, refs);
    }
    g
}

/// A cycle in `g`, if there is one.
fn cycle(g: &HashMap<String, HashSet<String>>) -> Option<Vec<String>> {
    fn visit(
        v: &str,
        g: &HashMap<String, HashSet<String>>,
        done: &mut HashSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == v) {
            return Some(path[i..].to_vec());
        }
        if !done.insert(v.to_string()) {
            return None;
        }
        path.push(v.to_string());
        let mut next: Vec<&String> = g.get(v).into_iter().flatten().collect();
        next.sort();
        for w in next {
            if let Some(c) = visit(w, g, done, path) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = HashSet::new();
    let mut keys: Vec<&String> = g.keys().collect();
    keys.sort();
    keys.into_iter()
        .find_map(|k| visit(k, g, &mut done, &mut Vec::new()))
}

/// No two source files of a crate import each other, directly or around a circle: a reader can take the
/// files in an order where each uses only those before it.
#[test]
fn no_import_circle_between_files() {
    let mut checked = 0;
    for krate in std::fs::read_dir(root()).unwrap().flatten() {
        let src = krate.path().join("src");
        if !krate.path().join("Cargo.toml").is_file() || !src.is_dir() {
            continue;
        }
        let g = module_graph(&src);
        checked += g.len();
        if let Some(c) = cycle(&g) {
            panic!(
                "{}: {} import each other in a circle",
                src.display(),
                c.join(" → ")
            );
        }
    }
    assert!(checked > 80, "only {checked} files checked");
    // The check itself finds a circle.
    let g: HashMap<String, HashSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(x, y)| (x.to_string(), HashSet::from([y.to_string()])))
        .collect();
    assert_eq!(cycle(&g).map(|c| c.len()), Some(3));
}

/// One `Channel` type: the channels the server counts are `tiergate_core::outcome::Channel`; the bench wraps
/// it with its client-side two (no answer, no tier header) instead of keeping a copy.
#[test]
fn one_channel_type() {
    let mut defs = Vec::new();
    let mut dirs = vec![root()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() && !name.starts_with('.') && name != "target" && name != "models" {
                dirs.push(p);
            } else if name.ends_with(".rs") {
                let code = code_of(&std::fs::read_to_string(&p).unwrap());
                let words = identifiers(&code);
                if words.windows(2).any(|w| w == ["enum", "Channel"]) {
                    defs.push(p);
                }
            }
        }
    }
    assert_eq!(defs.len(), 2, "enum Channel is defined in {defs:?}");
    assert!(defs.iter().any(|p| p.ends_with("core/src/outcome.rs")));
    let bench = std::fs::read_to_string(root().join("bench/src/stats.rs")).unwrap();
    assert!(
        bench.contains("Served(Served)"),
        "the bench's Channel keeps its own copy of the server's channels"
    );
}

/// The engine's wings, from the top: a wing may name (`crate::<wing>`) only the wings below it. The front
/// door (`engine/`, and `batch.rs`, whose traits name it) on top; the background work over the whole state
/// (`tasks/`); the request path (`answer/`); the state built once (`state.rs`); the lower wings, each taking
/// the parts it uses; the vocabulary (`model/`) at the bottom, beside `error.rs` and `metrics.rs`.
const WINGS: &[&str] = &[
    "batch", "engine", "tasks", "answer", "state", "cache", "evidence", "backends", "routing",
    "load", "tenancy", "deps", "model", "error", "metrics",
];

/// Each `crate::<name>` a file's code names (comments and `#[cfg(test)] mod tests` left out), with its line.
fn crate_paths(src: &str) -> Vec<(usize, String)> {
    let code = src.split("#[cfg(test)]\nmod tests").next().unwrap_or(src);
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((i + 1, name));
        }
    }
    out
}

#[test]
fn the_engines_wings_are_layers() {
    let src = root().join("engine/src");
    let mut files = Vec::new();
    let mut todo = vec![src.clone()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut wrong = Vec::new();
    let mut wings_seen = HashSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let name = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let test_only = rel.ends_with("_tests.rs") || rel == "costs.rs" || rel == "testing.rs";
        if name == "lib" || test_only {
            continue;
        }
        let at = WINGS.iter().position(|w| *w == name);
        let at = at.unwrap_or_else(|| panic!("engine/src/{rel}: wing `{name}` is not in WINGS"));
        wings_seen.insert(name.to_string());
        for (line, to) in crate_paths(&std::fs::read_to_string(f).unwrap()) {
            if to == name {
                continue;
            }
            match WINGS.iter().position(|w| *w == to) {
                Some(below) if below > at => {}
                Some(_) => wrong.push(format!("engine/src/{rel}:{line}: {name} names {to}, above it")),
                None => wrong.push(format!("engine/src/{rel}:{line}: `crate::{to}` is no wing (name the wing, not a re-export)")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every wing of the list exists: the order is of the tree as it is.
    for w in WINGS {
        assert!(wings_seen.contains(*w), "no engine/src/{w}(.rs)");
    }
}
