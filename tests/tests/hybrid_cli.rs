//! `tiergate eval --hybrid` end to end with the deterministic stub engine behind a real worker process: every
//! figure of its JSON is recomputed here from Tier-0's probabilities and the stub's known scoring rule
//! (score = ln(1 + 3 × words shared with the label)), and must match exactly. Also `fit-fusion` writes a
//! fit that the classifier then loads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;

use tiergate_config::Precision;
use tiergate_prefilter::testing::TinyModel;
use tiergate_prefilter::Classifier;
use tiergate_tests::binary;

const W: f64 = 0.5;

fn rows() -> Vec<(&'static str, &'static str)> {
    vec![
        ("please label1 help", "label1"),
        ("my card label2", "label2"),
        ("hello", "label0"),
        ("label0 is the one", "label0"),
        ("send money label1 label2", "label2"),
        ("what is my balance", "label1"),
        ("label2 label2 please", "label2"),
        ("bye", "label0"),
    ]
}

fn stub_score(text: &str, label: &str) -> f64 {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .collect();
    let shared = label
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && words.contains(&w.to_lowercase()))
        .count();
    (1.0 + 3.0 * shared as f64).ln()
}

/// A head trained by `tiergate train` on `rows` (written as `dir/rows.jsonl`) over the tiny encoder, 30% held
/// out, with `extra` arguments: the data file and the head folder.
fn train_head(
    tiny: &TinyModel,
    dir: &std::path::Path,
    rows: &[(&str, &str)],
    extra: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = write_rows(dir, rows);
    let head = dir.join("head");
    let out = Command::new(binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&head)
        .args(["--dev-fraction", "0.3"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "train: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (data, head)
}

/// `rows` as a JSONL data file in `dir`.
fn write_rows(dir: &std::path::Path, rows: &[(&str, &str)]) -> std::path::PathBuf {
    let data = dir.join("rows.jsonl");
    let body: String = rows
        .iter()
        .map(|(t, l)| format!("{}\n", serde_json::json!({"text": t, "label": l})))
        .collect();
    std::fs::write(&data, body).unwrap();
    data
}

/// The tiny checkpoint as `tiergate eval` loads it with the default config (its precision and token limit).
fn eval_classifier(tiny: &TinyModel) -> Classifier {
    let defaults = tiergate_config::load(None, Vec::new(), &[]).unwrap();
    Classifier::from_dir(
        tiny.dir.path(),
        defaults.prefilter.max_tokens,
        defaults.prefilter.precision,
    )
    .unwrap()
}

/// Per row: (ambiguity, Tier-0 right, LLM alone right, fused right).
type Expect = (f64, bool, bool, bool);

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

#[test]
fn eval_hybrid_with_the_stub_engine_gives_exact_figures() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = write_rows(dir.path(), &rows());
    let sets = [
        "reranker.engine=\"stub\"",
        "reranker.candidates=3",
        "reranker.llm_weight=0.5",
        "reranker.llm_temperature=1.0",
    ];
    let mut cmd = Command::new(binary("tiergate"));
    cmd.args(["eval", "--classifier"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .args(["--hybrid", "--json", "--max-escalated", "1.0"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "eval --hybrid failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // The expected figures, from Tier-0's probabilities and the stub's rule.
    let classifier = eval_classifier(&tiny);
    let labels = classifier.labels().to_vec();
    let mut expect: Vec<Expect> = Vec::new();
    for (text, gold) in rows() {
        let tokens = classifier.tokenizer.encode(text).unwrap();
        let p: Vec<f64> = classifier.probabilities(&[&tokens]).unwrap()[0]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let mut idx: Vec<usize> = (0..p.len()).collect();
        idx.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
        let sum: f64 = idx.iter().map(|&i| p[i]).sum();
        let scores: Vec<f64> = idx.iter().map(|&i| stub_score(text, &labels[i])).collect();
        let max = scores.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        let fused: Vec<f64> = idx
            .iter()
            .zip(&scores)
            .map(|(&i, s)| (1.0 - W) * p[i] / sum + W * (s - max).exp() / z)
            .collect();
        let right = |k: usize| labels[idx[k]] == gold;
        expect.push((
            1.0 - p[idx[0]],
            right(0),
            right(argmax(&scores)),
            right(argmax(&fused)),
        ));
    }
    let n = expect.len() as f64;
    assert_eq!(report["n"], 8);
    assert_eq!(report["llm_rows"], 8);
    assert_eq!(report["fusion_source"], "config");
    let grid = report["grid"].as_array().unwrap();
    assert!(grid.len() >= 19, "{grid:?}");
    for g in grid {
        let theta = g["theta"].as_f64().unwrap();
        let esc: Vec<_> = expect.iter().filter(|e| e.0 > theta).collect();
        let maybe = |f: &dyn Fn(&Expect) -> bool| {
            (!esc.is_empty()).then(|| esc.iter().filter(|e| f(e)).count() as f64 / esc.len() as f64)
        };
        let close = |key: &str, want: Option<f64>| match (g[key].as_f64(), want) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "θ {theta} {key}: {a} vs {b}"),
            (None, None) => {}
            (a, b) => panic!("θ {theta} {key}: {a:?} vs {b:?}"),
        };
        assert_eq!(
            g["escalated"].as_u64().unwrap() as usize,
            esc.len(),
            "θ {theta}"
        );
        close(
            "tier0_accuracy",
            Some(expect.iter().filter(|e| e.1).count() as f64 / n),
        );
        let hybrid = expect
            .iter()
            .filter(|e| if e.0 > theta { e.3 } else { e.1 })
            .count() as f64
            / n;
        close("hybrid_accuracy", Some(hybrid));
        close("escalated_tier0_accuracy", maybe(&|e| e.1));
        close("escalated_llm_accuracy", maybe(&|e| e.2));
        close("escalated_fused_accuracy", maybe(&|e| e.3));
    }
    // The stub knows the labels named in the text: right on each row that names its gold label alone (four
    // of them, whatever the random tiny Tier-0 says), and not Tier-0's copy, so the columns above can differ.
    let names_gold_alone = |text: &str, gold: &str| {
        labels
            .iter()
            .all(|l| (l == gold) == text.contains(l.as_str()))
    };
    let named: Vec<_> = rows()
        .into_iter()
        .zip(&expect)
        .filter(|((text, gold), _)| names_gold_alone(text, gold))
        .collect();
    assert_eq!(
        named.len(),
        4,
        "the fixture's rows naming their gold label alone"
    );
    for ((text, _), e) in named {
        assert!(e.2, "the stub is wrong on {text:?}");
    }
    assert!(
        expect.iter().any(|e| e.1 != e.2),
        "the stub and Tier-0 agree on every row: {expect:?}"
    );

    // `--rows`: lines are written as the LLM scores them, the most ambiguous first, then the rows it did not
    // see; a file cut short (a killed run) still gives the scores it holds.
    let rows_file = dir.path().join("rows-out.jsonl");
    let eval = |extra: &[&str]| {
        let mut cmd = Command::new(binary("tiergate"));
        cmd.args(["eval", "--classifier"])
            .arg(tiny.dir.path())
            .arg("--data")
            .arg(&data)
            .args(["--hybrid", "--json"])
            .args(extra);
        for s in sets {
            cmd.args(["--set", s]);
        }
        cmd.output().unwrap()
    };
    let rows_arg = rows_file.to_string_lossy().into_owned();
    let out = eval(&["--max-escalated", "0.5", "--rows", &rows_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&rows_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    let scored = lines
        .iter()
        .take_while(|v| v["llm_scores"].is_array())
        .count();
    assert_eq!(scored, 4, "{lines:?}");
    assert!(lines[scored..].iter().all(|v| v["llm_scores"].is_null()));
    let amb: Vec<f64> = lines
        .iter()
        .map(|v| v["ambiguity"].as_f64().unwrap())
        .collect();
    assert!(amb[..scored].windows(2).all(|w| w[0] >= w[1]), "{amb:?}");
    assert!(
        amb[scored..].iter().all(|&a| a <= amb[scored - 1]),
        "{amb:?}"
    );
    let mut rows_seen: Vec<u64> = lines.iter().map(|v| v["row"].as_u64().unwrap()).collect();
    rows_seen.sort_unstable();
    assert_eq!(rows_seen, (0..8).collect::<Vec<u64>>());
    let cut: String = lines[..2].iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(&rows_file, cut).unwrap();
    let out = eval(&["--from-rows", &rows_arg]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("2 of 8 rows"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["llm_rows"], 2, "{report}");
}

#[test]
fn fit_fusion_writes_a_fit_the_classifier_loads() {
    let tiny = TinyModel::create(3).unwrap();
    // fit-fusion wants a `tiergate train` folder: train a head on the tiny encoder.
    let dir = tempfile::tempdir().unwrap();
    let copies: Vec<(&str, &str)> = (0..6).flat_map(|_| rows()).collect();
    let (data, head) = train_head(&tiny, dir.path(), &copies, &[]);
    let out = Command::new(binary("tiergate"))
        .args(["fit-fusion", "--classifier"])
        .arg(&head)
        .arg("--data")
        .arg(&data)
        .args(["--dev-fraction", "0.3", "--max-escalated", "1.0"])
        .args([
            "--set",
            "reranker.engine=\"stub\"",
            "--set",
            "reranker.candidates=3",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fit-fusion: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fusion.json"), "{stdout}");
    let c = Classifier::from_dir(&head, 64, Precision::F32).unwrap();
    let f = c.fusion.expect("fusion.json loaded with the head");
    assert!(
        f.rows > 0 && (0.0..=1.0).contains(&f.llm_weight),
        "{f:?} {stdout}"
    );
    assert!(f.fused_accuracy >= f.tier0_accuracy, "{f:?}");
    assert_eq!(f.llm, "stub (channel)");
    // The fit is used with the LLM it was fitted with, and refused with another formulation.
    for (method, want) in [("channel", "fitted"), ("likelihood", "config")] {
        let out = Command::new(binary("tiergate"))
            .args(["eval", "--classifier"])
            .arg(&head)
            .arg("--data")
            .arg(&data)
            .args(["--hybrid", "--json", "--max-escalated", "0.3"])
            .args([
                "--set",
                "reranker.engine=\"stub\"",
                "--set",
                "reranker.candidates=3",
            ])
            .args(["--set", &format!("reranker.prompts.method=\"{method}\"")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["fusion_source"], want, "{method}");
        assert_eq!(report["llm"], format!("stub ({method})"));
    }
    // Scores written once (`eval --hybrid --rows`) fit the same fusion offline (`fit-fusion --from-rows`), and
    // a rows file from other data is refused.
    let rows_file = dir.path().join("rows-out.jsonl");
    let sets = [
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.candidates=3",
    ];
    let run = |args: &[&str]| {
        let out = Command::new(binary("tiergate"))
            .args(args)
            .arg("--classifier")
            .arg(&head)
            .arg("--data")
            .arg(&data)
            .args(["--dev-fraction", "0.3"])
            .args(sets)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let rows_arg = rows_file.to_string_lossy().into_owned();
    let (ok, err) = run(&[
        "eval",
        "--split",
        "dev",
        "--hybrid",
        "--json",
        "--max-escalated",
        "1.0",
        "--rows",
        &rows_arg,
    ]);
    assert!(ok, "{err}");
    let lines = std::fs::read_to_string(&rows_file).unwrap();
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert!(
        first["text"].is_string() && first["gold"].is_string(),
        "{first}"
    );
    assert_eq!(first["tier0"].as_array().unwrap().len(), 3, "{first}");
    assert_eq!(first["llm_scores"].as_array().unwrap().len(), 3, "{first}");
    assert_eq!(first["llm"], "stub (channel)");
    let (ok, err) = run(&["fit-fusion", "--from-rows", &rows_arg]);
    assert!(ok, "{err}");
    let g = Classifier::from_dir(&head, 64, Precision::F32)
        .unwrap()
        .fusion
        .unwrap();
    assert_eq!(
        (
            g.llm_weight,
            g.llm_temperature,
            g.rows,
            g.rows_fixed,
            g.rows_broken
        ),
        (
            f.llm_weight,
            f.llm_temperature,
            f.rows,
            f.rows_fixed,
            f.rows_broken
        ),
        "the offline fit equals the one that ran the LLM"
    );
    let (ok, err) = run(&["fit-fusion", "--split", "all", "--from-rows", &rows_arg]);
    assert!(!ok && err.contains("another text"), "{err}");
    // Representative utterances were stored with the head at train time.
    assert_eq!(c.examples.len(), 3);
    assert!(c.examples.iter().all(|e| !e.is_empty()), "{:?}", c.examples);
}

/// `tiergate eval --oos` on the same fixture with one label declared out of scope (`--oos-label label0`) and a
/// threshold on 1 − max p (the tiny checkpoint has no `oos.json`): every figure recomputed here by counting.
#[test]
fn eval_oos_gives_exact_open_intent_figures() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = write_rows(dir.path(), &rows());
    let classifier = eval_classifier(&tiny);
    let labels = classifier.labels().to_vec();
    // (gold class: None out of scope, Tier-0's label, score 1 − max p)
    let scored: Vec<(Option<usize>, usize, f32)> = rows()
        .iter()
        .map(|(text, gold)| {
            let t = classifier.tokenizer.encode(text).unwrap();
            let p = classifier.probabilities(&[&t]).unwrap().remove(0);
            let (arg, max) =
                (0..p.len()).fold((0, f32::MIN), |b, i| if p[i] > b.1 { (i, p[i]) } else { b });
            let g = (*gold != "label0").then(|| labels.iter().position(|l| l == gold).unwrap());
            (g, arg, 1.0 - max)
        })
        .collect();
    let mut sorted: Vec<f32> = scored.iter().map(|s| s.2).collect();
    sorted.sort_by(f32::total_cmp);
    // A threshold between two scores, so that rounding cannot move a row across it.
    let threshold = (sorted[3] + sorted[4]) / 2.0;
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .args(["--oos", "--oos-label", "label0", "--json"])
        .args(["--oos-threshold", &threshold.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Classes: the head's labels (label0 is never gold), and out of scope.
    let unknown = labels.len();
    let called = |s: &(Option<usize>, usize, f32)| if s.2 > threshold { unknown } else { s.1 };
    let class = |s: &(Option<usize>, usize, f32)| s.0.unwrap_or(unknown);
    let right = scored.iter().filter(|s| called(s) == class(s)).count();
    let oos: Vec<_> = scored.iter().filter(|s| s.0.is_none()).collect();
    let caught = oos.iter().filter(|s| s.2 > threshold).count();
    let calls = scored.iter().filter(|s| s.2 > threshold).count();
    let inside: Vec<_> = scored.iter().filter(|s| s.0.is_some()).collect();
    let inside_right = inside.iter().filter(|s| called(s) == class(s)).count();
    let f1s: Vec<f64> = (0..=unknown)
        .filter_map(|k| {
            let support = scored.iter().filter(|s| class(s) == k).count();
            let c = scored.iter().filter(|s| called(s) == k).count();
            let tp = scored
                .iter()
                .filter(|s| class(s) == k && called(s) == k)
                .count();
            (support + c > 0).then(|| 2.0 * tp as f64 / (support + c) as f64)
        })
        .collect();
    let close = |key: &str, want: f64| {
        let got = r[key].as_f64().unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-9, "{key}: {got} vs {want} in {r}");
    };
    assert_eq!(
        (r["n"].as_u64(), r["oos_rows"].as_u64()),
        (Some(8), Some(oos.len() as u64))
    );
    assert_eq!(oos.len(), 3, "hello, label0 is the one, bye");
    assert_eq!(r["method"], "msp");
    assert_eq!(r["known_labels"].as_u64(), Some(labels.len() as u64));
    close("accuracy", right as f64 / 8.0);
    close("oos_recall", caught as f64 / 3.0);
    close(
        "in_scope_accuracy",
        inside_right as f64 / inside.len() as f64,
    );
    close("macro_f1", f1s.iter().sum::<f64>() / f1s.len() as f64);
    match calls {
        0 => assert!(r["oos_precision"].is_null()),
        c => close("oos_precision", caught as f64 / c as f64),
    }
    // Without a fitted threshold and without --oos-threshold the command says what is missing.
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .arg("--oos")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--oos-threshold"));
}

/// `eval --hybrid` on a route with an out-of-scope outcome: the stub LLM is shown "none of these" as the last
/// candidate (Tier-0 gives it no mass: the threshold is above every score), rows labelled `out_of_scope` are
/// gold for it, and the LLM-alone and fused accuracies over every row are recomputed here exactly.
#[test]
fn eval_hybrid_offers_none_of_these_and_scores_it() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut all = rows();
    all.push(("none of these apply", "out_of_scope"));
    all.push(("none of these fit me", "out_of_scope"));
    let data = write_rows(dir.path(), &all);
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .args(["--hybrid", "--json", "--max-escalated", "1.0"])
        .args(["--set", "reranker.engine=\"stub\"", "--set", "reranker.candidates=3"])
        .args(["--set", "reranker.llm_weight=0.5", "--set", "reranker.llm_temperature=1.0"])
        .args([
            "--set",
            "routes=[{ name = \"classify\", kind = \"classify\", out_of_scope = { label = \"out_of_scope\", threshold = 2.0 } }]",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classifier = eval_classifier(&tiny);
    let labels = classifier.labels().to_vec();
    let (mut llm_right, mut fused_right) = (0, 0);
    for (text, gold) in &all {
        let tokens = classifier.tokenizer.encode(text).unwrap();
        let p: Vec<f64> = classifier.probabilities(&[&tokens]).unwrap()[0]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let mut idx: Vec<usize> = (0..p.len()).collect();
        idx.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
        idx.truncate(3);
        let sum: f64 = idx.iter().map(|&i| p[i]).sum();
        // The candidates: Tier-0's three labels, then "none of these" (Tier-0 mass 0).
        let mut names: Vec<&str> = idx.iter().map(|&i| labels[i].as_str()).collect();
        let mut tier0: Vec<f64> = idx.iter().map(|&i| p[i] / sum).collect();
        names.push("none of these");
        tier0.push(0.0);
        let scores: Vec<f64> = names.iter().map(|l| stub_score(text, l)).collect();
        let max = scores.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        let fused: Vec<f64> = tier0
            .iter()
            .zip(&scores)
            .map(|(t, s)| 0.5 * t + 0.5 * (s - max).exp() / z)
            .collect();
        let answer = |k: usize| if k == 3 { "out_of_scope" } else { names[k] };
        llm_right += usize::from(answer(argmax(&scores)) == *gold);
        fused_right += usize::from(answer(argmax(&fused)) == *gold);
    }
    let all_escalated = report["grid"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["escalated"] == 10)
        .unwrap_or_else(|| panic!("no grid point escalates all 10 rows: {report}"));
    let n = all.len() as f64;
    let close = |key: &str, want: f64| {
        let got = all_escalated[key].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9, "{key}: {got} vs {want}");
    };
    close("escalated_llm_accuracy", llm_right as f64 / n);
    close("escalated_fused_accuracy", fused_right as f64 / n);
    // Tier-0 never answers out of scope here, so its two out-of-scope rows are wrong.
    assert!(all_escalated["escalated_tier0_accuracy"].as_f64().unwrap() <= 0.8);
    // The stub names "none of these" for the two rows that say it, and the fusion follows.
    assert!(
        llm_right >= 2 && fused_right >= 2,
        "{llm_right} {fused_right}"
    );
}

/// A cascade offline: the first stage's rows (`stub (channel)`) fitted into `fusion.json`, a second stage
/// (`stub (likelihood)`, another LLM name for the same stub) fitted with `fit-fusion --stage big` on what the
/// first leaves, written as `fusion.big.json` naming the chain, loaded with the head; `eval --stage-rows`
/// measures the cascade, whose θ2 = 1 points are the first stage alone. A stage whose earlier stage has no fit
/// is refused.
#[test]
fn a_stage_fit_starts_from_the_earlier_stage_and_the_cascade_is_measured() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Every third copy of a text carries another label: Tier-0 stays unsure, so there is something to escalate.
    let labels = ["label0", "label1", "label2"];
    let copies: Vec<(&str, &str)> = (0..6)
        .flat_map(|copy| {
            rows().into_iter().enumerate().map(move |(k, (t, l))| {
                (
                    t,
                    if copy % 3 == 0 {
                        labels[(k + copy) % 3]
                    } else {
                        l
                    },
                )
            })
        })
        .collect();
    let (data, head) = train_head(&tiny, dir.path(), &copies, &["--epochs", "1"]);
    let run = |args: &[&str], method: &str| {
        let out = Command::new(binary("tiergate"))
            .args(args)
            .arg("--classifier")
            .arg(&head)
            .arg("--data")
            .arg(&data)
            .args([
                "--split",
                "all",
                "--set",
                "reranker.engine=\"stub\"",
                "--set",
                "reranker.candidates=3",
            ])
            .args(["--set", &format!("reranker.prompts.method=\"{method}\"")])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let path = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (small, big) = (path("small.jsonl"), path("big.jsonl"));
    for (file, method) in [(&small, "channel"), (&big, "likelihood")] {
        let (ok, _, err) = run(
            &[
                "eval",
                "--hybrid",
                "--json",
                "--max-escalated",
                "0.5",
                "--rows",
                file,
            ],
            method,
        );
        assert!(ok, "{err}");
    }
    // The second stage before the first is fitted: refused, naming what to do.
    let stage = [
        "fit-fusion",
        "--stage",
        "big",
        "--prior-rows",
        &small,
        "--from-rows",
        &big,
    ];
    let (ok, _, err) = run(&stage, "channel");
    assert!(!ok && err.contains("has no fit"), "{err}");
    let (ok, _, err) = run(&["fit-fusion", "--from-rows", &small], "channel");
    assert!(ok, "{err}");
    let (ok, out, err) = run(&stage, "channel");
    assert!(ok, "{err}");
    assert!(out.contains("fusion.big.json"), "{out}");
    let c = Classifier::from_dir(&head, 64, Precision::F32).unwrap();
    let first = c.fusion.clone().unwrap();
    let (name, f) = c.stage_fusions.first().expect("fusion.big.json loaded");
    assert_eq!(name, "big");
    assert_eq!(f.llm, "stub (likelihood)");
    assert_eq!(f.after, vec!["stub (channel)".to_string()]);
    assert_eq!(f.rows, first.rows, "every row the first stage scored");
    // The cascade, measured: at θ2 = 1 nothing goes on and the accuracy is the first stage's hybrid.
    let (ok, out, err) = run(
        &[
            "eval",
            "--hybrid",
            "--json",
            "--from-rows",
            &small,
            "--stage-rows",
            &big,
        ],
        "channel",
    );
    assert!(ok, "{err}");
    let cascade: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        cascade["fusion_sources"],
        serde_json::json!(["fitted", "fitted"])
    );
    assert_eq!(
        cascade["llms"],
        serde_json::json!(["stub (channel)", "stub (likelihood)"])
    );
    let (ok, out, err) = run(
        &["eval", "--hybrid", "--json", "--from-rows", &small],
        "channel",
    );
    assert!(ok, "{err}");
    let single: serde_json::Value = serde_json::from_str(&out).unwrap();
    let points = cascade["cascade"].as_array().unwrap();
    assert!(!points.is_empty(), "{cascade}");
    let mut compared = 0;
    for p in points.iter().filter(|p| p["second_theta"] == 1.0) {
        assert_eq!(p["second_rows"], 0, "{p}");
        let theta = p["first_theta"].as_f64().unwrap();
        let same = single["grid"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| (g["theta"].as_f64().unwrap() - theta).abs() < 1e-9);
        if let Some(g) = same {
            assert_eq!(g["hybrid_accuracy"], p["accuracy"], "{g} {p}");
            compared += 1;
        }
    }
    assert!(compared >= 1, "the 10% point is on both grids: {cascade}");
    // Lower θ2 sends more rows on, never more than the first stage scored.
    let most = points
        .iter()
        .map(|p| p["second_rows"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(most > 0, "{cascade}");
    assert!(points
        .iter()
        .all(|p| p["second_rows"].as_u64() <= p["first_rows"].as_u64()));
}

/// `eval --risk` on a checkpoint (no `calibration.json`): calibrated on a seeded quarter of the rows it is
/// given and measured on the half neither ordered nor calibrated θ; every θ is the Learn-then-Test choice
/// recomputed here from the checkpoint's own probabilities and the same split.
#[test]
fn eval_risk_works_on_a_checkpoint_by_calibrating_on_held_rows() {
    use tiergate_core::risk::{choose, Row};
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let classifier = eval_classifier(&tiny);
    let words = tiergate_prefilter::testing::TINY_WORDS;
    // 400 texts of the tiny vocabulary; the gold label is the checkpoint's own answer but on every 15th row,
    // so its confident answers are mostly right and θ can be above 0.
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut evaluated: Vec<Row> = Vec::new();
    for i in 0..400usize {
        let text = (0..2 + i % 3)
            .map(|j| words[(i * 7 + j * 11 + i / 25) % words.len()])
            .collect::<Vec<_>>()
            .join(" ");
        let t = classifier.tokenizer.encode(&text).unwrap();
        let p = &classifier.probabilities(&[&t]).unwrap()[0];
        let (top, conf) = tiergate_prefilter::calibrate::argmax(p);
        let wrong = i % 15 == 0;
        let gold = if wrong { (top + 1) % 3 } else { top };
        evaluated.push(Row {
            ambiguity: (1.0 - f64::from(conf)).clamp(0.0, 1.0),
            wrong,
        });
        rows.push((text, format!("label{gold}")));
    }
    let refs: Vec<(&str, &str)> = rows.iter().map(|(t, l)| (t.as_str(), l.as_str())).collect();
    let data = write_rows(dir.path(), &refs);
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(tiny.dir.path())
        .arg("--data")
        .arg(&data)
        .args(["--risk", "--json", "--seed", "9"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "eval --risk on a checkpoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["calibration_source"], "data", "{v}");
    assert!(v["calibration_flaw"].is_null());
    assert_eq!(v["rows"], 200, "measured on the half that chose nothing");
    let (ordering, calibration, _) = tiergate_train::risk::split_rows(&evaluated, 9);
    let mut positive = 0;
    for r in v["risk"].as_array().unwrap() {
        assert_eq!(r["n_calibration"], 100);
        let want = choose(
            &ordering,
            &calibration,
            r["max_error"].as_f64().unwrap(),
            0.05,
        );
        let got = r["theta"].as_f64().unwrap();
        // The binary scores rows in padded batches, this test one at a time: the same row's confidence can
        // differ in the fourth decimal (seen once in CI: 0.59617 against 0.59534). The choice is the same
        // grid point when its bound (a function of its accepted and wrong counts only) is the same, and θ
        // is that row's ambiguity up to the scoring noise.
        let bound = r["upper_bound"].as_f64().unwrap();
        assert!(
            (bound - want.upper_bound).abs() < 1e-9,
            "{r} against {want:?}"
        );
        assert!((got - want.theta).abs() < 1e-2, "{r} against {want:?}");
        positive += usize::from(got > 0.0);
    }
    assert!(positive > 0, "some ε is shown on 100 rows: {v}");
}

/// A head whose dev split is too small to halve is flagged by `train` and by `eval --risk`.
#[test]
fn a_head_with_in_sample_calibration_rows_is_flagged() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // One dev row a label at most: the halves are the same rows.
    let few: Vec<(&str, &str)> = rows().into_iter().chain(rows()).collect();
    let (data, head) = train_head(&tiny, dir.path(), &few, &["--seed", "3"]);
    let cal = tiergate_prefilter::risk_rows::CalibrationRows::load(&head)
        .unwrap()
        .unwrap();
    let (meta, _) = tiergate_prefilter::heads::load_trained(&head).unwrap();
    assert_eq!(
        meta.dev.calibration_flaw,
        cal.flaw(),
        "head.json carries the flag"
    );
    let out = Command::new(binary("tiergate"))
        .args(["eval", "--classifier"])
        .arg(&head)
        .arg("--data")
        .arg(&data)
        .args(["--risk"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    match cal.flaw() {
        Some(f) => assert!(text.contains("WARNING") && text.contains(&f), "{text}"),
        None => panic!("16 rows over 3 labels with 30% dev should not halve cleanly: {cal:?}"),
    }
}
