//! Distillation end to end on the real MiniLM: `tiergate train` a head on the project's workload, serve it
//! with `server.record_escalations` (stub LLM worker, θ = 0 so every request is a rerank the LLM answers),
//! then `tiergate distill` those records, with labelled audits and trusted feedback beside them, into a new head
//! that loads and serves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;

use serde_json::{json, Value};
use tiergate_tests::{binary, minilm_dir, root};

mod common;
use common::start;

/// Text no label of the workload is about.
const PROBE: &str = "zebra quilt violin marmalade";

#[test]
fn escalations_are_recorded_and_distilled_into_a_head_that_serves() {
    let work = tempfile::tempdir().unwrap();
    let data = root().join("bench/workloads/bank24.jsonl");
    let head = work.path().join("head");
    let train = Command::new(binary("tiergate"))
        .args(["train", "--encoder"])
        .arg(minilm_dir())
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&head)
        .args(["--dev-fraction", "0.25", "--precision", "f32"])
        .output()
        .unwrap();
    assert!(
        train.status.success(),
        "{}",
        String::from_utf8_lossy(&train.stderr)
    );

    let records = work.path().join("records/escalations.jsonl");
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
        "--set",
        "prefilter.precision=\"f32\"",
        "--set",
        &format!(
            "prefilter.head={{kind=\"trained\", dir=\"{}\"}}",
            head.display()
        ),
        "--set",
        &format!("server.record_escalations=\"{}\"", records.display()),
    ]);
    // 39 rows of the workload and a probe no label is about: its record tells what the old head answers there.
    let mut texts: Vec<String> = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .take(39)
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    texts.push(format!("{PROBE} 0"));
    let mut old_version = String::new();
    for t in &texts {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": t}]}))
            .unwrap();
        assert_eq!(r.header("x-tiergate-tier"), Some("llm"));
        old_version = r.header("x-tiergate-head-version").unwrap().to_string();
    }
    drop(s);
    let lines: Vec<Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), texts.len(), "one record per answered rerank");
    for (rec, t) in lines.iter().zip(&texts) {
        assert_eq!(rec["text"].as_str(), Some(t.as_str()));
        let fused: f64 = rec["fused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .sum();
        assert!((fused - 1.0).abs() < 1e-3, "{rec}");
        assert_eq!(
            rec["candidates"].as_array().unwrap().len(),
            rec["tier0"].as_array().unwrap().len()
        );
    }

    // Gold beside the LLM's verdicts, as the server writes it when an operator labels an audit or a trusted
    // tenant names the true label: 20 audits drawn at 50% (weight 2; half held out to measure both heads on)
    // and one feedback on a text the LLM answered, which replaces its verdict.
    let rows: Vec<Value> = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The old head's top label on the probe, and a label it does not answer there: trusted feedback on 24
    // variants of the probe names that label, which only a distill that changes the head can learn.
    let probe_record = lines.last().unwrap();
    let labels: Vec<&str> = probe_record["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let old_top = labels[0];
    let taught = labels[labels.len() - 1];
    assert_ne!(old_top, taught);
    let mut gold: Vec<String> = rows[40..60]
        .iter()
        .map(|r| {
            json!({"source": "audit", "route": "classify", "text": r["text"], "label": r["label"],
                "probability": 0.5})
            .to_string()
        })
        .collect();
    gold.push(
        json!({"source": "feedback", "route": "classify", "text": rows[0]["text"], "label": rows[0]["label"]})
            .to_string(),
    );
    for i in 1..=24 {
        gold.push(
            json!({"source": "feedback", "route": "classify", "text": format!("{PROBE} {i}"), "label": taught})
                .to_string(),
        );
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&records)
        .unwrap();
    std::io::Write::write_all(&mut file, (gold.join("\n") + "\n").as_bytes()).unwrap();

    let out = work.path().join("distilled");
    let report = work.path().join("report.json");
    let d = Command::new(binary("tiergate"))
        .args(["distill", "--classifier"])
        .arg(&head)
        .arg("--records")
        .arg(&records)
        .arg("--data")
        .arg(&data)
        .args([
            "--dev-fraction",
            "0.25",
            "--precision",
            "f32",
            "--epochs",
            "60",
            "--holdout-audits",
            "0.5",
            "--out",
        ])
        .arg(&out)
        .arg("--json")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&d.stdout);
    assert!(
        d.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&d.stderr)
    );
    assert!(
        stdout.contains("before: dev accuracy") && stdout.contains(" after: dev accuracy"),
        "{stdout}"
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let h = &r["harvest"];
    let held = r["audits_held_out"].as_u64().unwrap();
    assert_eq!(
        (
            h["llm"].as_u64(),
            h["audit"].as_u64(),
            h["feedback"].as_u64(),
            h["llm_overridden"].as_u64()
        ),
        (Some(texts.len() as u64 - 1), Some(20), Some(25), Some(1)),
        "{r}"
    );
    assert!((1..20).contains(&held), "{r}");
    // Records whose text is a dev row (the rows both heads are measured on) are not trained on: with a
    // quarter of the workload in dev, some of the 59 workload texts are.
    let in_dev = r["records_in_dev"].as_u64().unwrap();
    assert!(in_dev > 0 && in_dev < 40, "{r}");
    assert_eq!(
        r["records_used"].as_u64().unwrap() + in_dev,
        texts.len() as u64 - 1 + 20 - held + 25
    );
    assert!(stdout.contains("held-out audits"), "{stdout}");
    // Both heads are measured on the same dev rows (none of them trained on: see records_in_dev).
    let (before, after) = (&r["before"], &r["after"]);
    assert!(
        before["dev_accuracy"].is_number() && after["dev_accuracy"].is_number(),
        "{r}"
    );
    assert!(
        after["audit_accuracy"].is_number() && before["audit_accuracy"].is_number(),
        "{r}"
    );
    // The weights changed (a distill that copies the head writes the same file).
    assert_ne!(
        std::fs::read(out.join("head.safetensors")).unwrap(),
        std::fs::read(head.join("head.safetensors")).unwrap()
    );
    // The refreshed head loads as a serving head, with its own risk calibration rows (the error bound of a
    // promoted head rests on them) and its dev figures on the held half, as `train` writes them.
    assert!(out.join("calibration.json").is_file());
    let rows = tiergate_prefilter::risk_rows::CalibrationRows::load(&out)
        .unwrap()
        .unwrap();
    let (meta, _) = tiergate_prefilter::heads::load_trained(&out).unwrap();
    assert_eq!(rows.rows.len(), meta.dev.n);
    assert_eq!(
        rows.rows.len() + rows.ordering.len(),
        r["dev_rows"].as_u64().unwrap() as usize
    );
    assert_eq!(rows.temperature, meta.temperature);
    for (k, x) in [
        ("ece", meta.dev.ece),
        ("ece_uncalibrated", meta.dev.ece_uncalibrated),
        ("accuracy", meta.dev.accuracy),
    ] {
        assert!((0.0..=1.0).contains(&x), "dev.{k} = {x}");
    }
    assert_eq!(
        meta.temperature,
        r["after"]["temperature"].as_f64().unwrap()
    );

    // The distilled head serves: Tier-0 alone (θ = 1) answers new variants of the probe with the taught label,
    // where the old head answered another, under a new head version.
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        "prefilter.precision=\"f32\"",
        "--set",
        &format!(
            "prefilter.head={{kind=\"trained\", dir=\"{}\"}}",
            out.display()
        ),
    ]);
    let mut answered = Vec::new();
    for i in [31, 57, 88] {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .send_json(json!({"model": "classify", "messages": [{"role": "user", "content": format!("{PROBE} {i}")}]}))
            .unwrap();
        assert_eq!(r.header("x-tiergate-tier"), Some("tier0"));
        assert_ne!(
            r.header("x-tiergate-head-version"),
            Some(old_version.as_str())
        );
        let v: Value = r.into_json().unwrap();
        answered.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(
        answered.iter().all(|a| a == taught),
        "the distilled head answers {answered:?} where it was taught `{taught}` (the old head: `{old_top}`)"
    );
}
