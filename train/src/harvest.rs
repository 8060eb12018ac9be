//! What traffic teaches Tier-0: the lines of a server's record file (`server.record_escalations`) as training
//! records with their provenance and weight.
//!
//! - `llm` (an escalation the LLM answered; lines without `source` are these): a soft target, the fused
//!   distribution over Tier-0's candidates, weight 1.
//! - `audit` (an answer Tier-0 gave alone, drawn with probability p and labelled by an operator): the gold
//!   label, weight 1/p (capped), so the audited answers stand for all the answers they were drawn from.
//! - `feedback` (a trusted tenant's true label on an answer): the gold label, weight 1.
//! - `tier0` (a label Tier-0 answered alone and sure, `server.record_tier0`): a pseudo-label, weight 1
//!   (`distill --tier0-weight` scales it).
//!
//! Gold is preferred over the LLM's verdict: where a text has a gold record, its LLM records are dropped
//! (and counted, with how often the LLM disagreed with the gold label).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Serialize;
use tiergate_prefilter::calibrate::argmax;
use tiergate_prefilter::error::{PrefilterError, Result};

/// Where a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Llm,
    Audit,
    Feedback,
    /// Tier-0's own sure answer: not gold.
    Tier0,
}

impl Source {
    /// A gold label (an operator's or a trusted tenant's), not the LLM's verdict.
    pub fn is_gold(self) -> bool {
        matches!(self, Source::Audit | Source::Feedback)
    }
}

/// One training record.
#[derive(Debug, Clone, PartialEq)]
pub struct Harvested {
    pub text: String,
    /// Distribution over the head's labels (one-hot for gold).
    pub target: Vec<f32>,
    pub source: Source,
    /// How many training rows it counts as (an audit's 1/p, capped).
    pub weight: f64,
}

/// What reading a record file found.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HarvestCounts {
    pub llm: usize,
    pub audit: usize,
    pub feedback: usize,
    pub tier0: usize,
    /// Lines not usable: bad JSON, no text, a label the head does not know (an out-of-scope answer), no mass.
    pub skipped: usize,
    /// LLM records dropped because the same text has a gold label.
    pub llm_overridden: usize,
    /// Tier-0 pseudo-labels dropped because the same text has a gold label or an LLM verdict.
    pub tier0_overridden: usize,
    /// Of those, the ones whose LLM verdict (fused top label) was not the gold label.
    pub llm_contradicted: usize,
    /// Audit weights cut to the cap.
    pub audit_weights_capped: usize,
}

/// The records of `path` over `labels`, gold preferred over LLM verdicts; audit weights 1/p capped at
/// `max_audit_weight`.
pub fn read(
    path: &Path,
    labels: &[String],
    max_audit_weight: f64,
) -> Result<(Vec<Harvested>, HarvestCounts)> {
    let raw = std::fs::read_to_string(path).map_err(|e| PrefilterError::file(path, e))?;
    let mut counts = HarvestCounts::default();
    let mut all = Vec::new();
    for line in raw.lines().filter(|l| !l.trim().is_empty()) {
        match parse(line, labels, max_audit_weight) {
            Some((h, capped)) => {
                counts.audit_weights_capped += usize::from(capped);
                all.push(h);
            }
            None => counts.skipped += 1,
        }
    }
    let gold: HashMap<&str, usize> = all
        .iter()
        .filter(|h| h.source.is_gold())
        .map(|h| (h.text.as_str(), argmax(&h.target).0))
        .collect();
    let judged: HashSet<&str> = all
        .iter()
        .filter(|h| h.source == Source::Llm)
        .map(|h| h.text.as_str())
        .collect();
    let mut dropped = HashSet::new();
    for (i, h) in all.iter().enumerate() {
        match (h.source, gold.get(h.text.as_str())) {
            (Source::Llm, Some(&g)) => {
                dropped.insert(i);
                counts.llm_overridden += 1;
                counts.llm_contradicted += usize::from(argmax(&h.target).0 != g);
            }
            (Source::Tier0, g) if g.is_some() || judged.contains(h.text.as_str()) => {
                dropped.insert(i);
                counts.tier0_overridden += 1;
            }
            _ => {}
        }
    }
    let kept: Vec<Harvested> = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !dropped.contains(i))
        .map(|(_, h)| h)
        .collect();
    for h in &kept {
        match h.source {
            Source::Llm => counts.llm += 1,
            Source::Audit => counts.audit += 1,
            Source::Feedback => counts.feedback += 1,
            Source::Tier0 => counts.tier0 += 1,
        }
    }
    Ok((kept, counts))
}

/// One line as a record (and whether its weight was capped); `None` when it cannot train the head.
pub fn parse(line: &str, labels: &[String], max_audit_weight: f64) -> Option<(Harvested, bool)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = v["text"].as_str().filter(|t| !t.trim().is_empty())?;
    let source = match v["source"].as_str() {
        None | Some("llm") => Source::Llm,
        Some("audit") => Source::Audit,
        Some("feedback") => Source::Feedback,
        Some("tier0") => Source::Tier0,
        Some(_) => return None,
    };
    let (target, weight, capped) = match source {
        Source::Llm => (soft_target(&v, labels)?, 1.0, false),
        Source::Audit => {
            let p = v["probability"]
                .as_f64()
                .filter(|p| *p > 0.0 && *p <= 1.0)?;
            let w = 1.0 / p;
            (
                one_hot(&v, labels)?,
                w.min(max_audit_weight),
                w > max_audit_weight,
            )
        }
        Source::Feedback | Source::Tier0 => (one_hot(&v, labels)?, 1.0, false),
    };
    let h = Harvested {
        text: text.to_string(),
        target,
        source,
        weight,
    };
    Some((h, capped))
}

/// The gold `label` as a one-hot distribution over `labels`.
fn one_hot(v: &serde_json::Value, labels: &[String]) -> Option<Vec<f32>> {
    let label = v["label"].as_str()?;
    let i = labels.iter().position(|l| l == label)?;
    let mut t = vec![0f32; labels.len()];
    t[i] = 1.0;
    Some(t)
}

/// The fused probabilities on the record's candidates, renormalised over the head's labels.
fn soft_target(v: &serde_json::Value, labels: &[String]) -> Option<Vec<f32>> {
    let candidates = v["candidates"].as_array()?;
    let fused = v["fused"].as_array()?;
    if candidates.len() != fused.len() || candidates.is_empty() {
        return None;
    }
    let mut target = vec![0f32; labels.len()];
    for (c, p) in candidates.iter().zip(fused) {
        let i = labels.iter().position(|l| Some(l.as_str()) == c.as_str())?;
        let p = p.as_f64()? as f32;
        if !(p.is_finite() && p >= 0.0) {
            return None;
        }
        target[i] += p;
    }
    let sum: f32 = target.iter().sum();
    (sum > 0.0).then(|| {
        target.iter_mut().for_each(|p| *p /= sum);
        target
    })
}

/// Whether a text is held out of training (for the report), by a seeded hash: about `share` of the texts.
pub fn held_out(text: &str, share: f64, seed: u64) -> bool {
    tiergate_core::fnv::Fnv::seeded(seed)
        .eat(text.as_bytes())
        .unit()
        < share
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_source_has_its_target_and_weight() {
        let l = labels();
        let (llm, _) = parse(
            r#"{"text":"x","candidates":["c","a"],"fused":[0.6,0.2]}"#,
            &l,
            20.0,
        )
        .unwrap();
        assert_eq!(
            (llm.source, llm.target, llm.weight),
            (Source::Llm, vec![0.25, 0.0, 0.75], 1.0)
        );
        let (audit, capped) = parse(
            r#"{"source":"audit","text":"y","label":"b","probability":0.1}"#,
            &l,
            20.0,
        )
        .unwrap();
        assert_eq!(
            (audit.source, audit.target.clone()),
            (Source::Audit, vec![0.0, 1.0, 0.0])
        );
        assert!((audit.weight - 10.0).abs() < 1e-9 && !capped, "1/p");
        let (rare, capped) = parse(
            r#"{"source":"audit","text":"y","label":"b","probability":0.01}"#,
            &l,
            20.0,
        )
        .unwrap();
        assert!(rare.weight == 20.0 && capped, "1/p = 100 is capped at 20");
        let (fb, _) = parse(r#"{"source":"feedback","text":"z","label":"c"}"#, &l, 20.0).unwrap();
        assert_eq!(
            (fb.source, fb.target, fb.weight),
            (Source::Feedback, vec![0.0, 0.0, 1.0], 1.0)
        );
        let (t0, _) = parse(
            r#"{"source":"tier0","text":"z","label":"a","ambiguity":0.1}"#,
            &l,
            20.0,
        )
        .unwrap();
        assert_eq!(
            (t0.source, t0.target, t0.weight),
            (Source::Tier0, vec![1.0, 0.0, 0.0], 1.0)
        );
        for bad in [
            r#"{"candidates":["a"],"fused":[1.0]}"#,
            r#"{"text":"x","candidates":["z"],"fused":[1.0]}"#,
            r#"{"text":"x","candidates":["a"],"fused":[0.0]}"#,
            r#"{"text":"x","candidates":["a","b"],"fused":[1.0]}"#,
            r#"{"source":"audit","text":"y","label":"b"}"#,
            r#"{"source":"audit","text":"y","label":"b","probability":0}"#,
            r#"{"source":"audit","text":"y","label":"none_of_these","probability":0.5}"#,
            r#"{"source":"feedback","text":"z"}"#,
            r#"{"source":"rumour","text":"z","label":"a"}"#,
            "not json",
        ] {
            assert!(parse(bad, &l, 20.0).is_none(), "{bad}");
        }
    }

    #[test]
    fn gold_overrides_the_llms_verdict_on_the_same_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.jsonl");
        std::fs::write(
            &path,
            [
                r#"{"text":"q1","candidates":["a","b"],"fused":[0.9,0.1]}"#,
                r#"{"text":"q2","candidates":["a","b"],"fused":[0.2,0.8]}"#,
                r#"{"text":"q3","candidates":["c","b"],"fused":[0.7,0.3]}"#,
                r#"{"source":"audit","text":"q1","label":"b","probability":0.5}"#,
                r#"{"source":"feedback","text":"q2","label":"b"}"#,
                r#"{"source":"tier0","text":"q1","label":"a"}"#,
                r#"{"source":"tier0","text":"q3","label":"c"}"#,
                r#"{"source":"tier0","text":"q4","label":"c"}"#,
                "garbage",
            ]
            .join("\n"),
        )
        .unwrap();
        let (kept, counts) = read(&path, &labels(), 20.0).unwrap();
        let texts: Vec<(&str, Source)> = kept.iter().map(|h| (h.text.as_str(), h.source)).collect();
        assert_eq!(
            texts,
            [
                ("q3", Source::Llm),
                ("q1", Source::Audit),
                ("q2", Source::Feedback),
                ("q4", Source::Tier0)
            ],
            "Tier-0's own answer stands only where nothing better is known"
        );
        assert_eq!(
            counts,
            HarvestCounts {
                llm: 1,
                audit: 1,
                feedback: 1,
                tier0: 1,
                skipped: 1,
                llm_overridden: 2,
                tier0_overridden: 2,
                llm_contradicted: 1,
                audit_weights_capped: 0,
            }
        );
    }

    #[test]
    fn the_held_out_share_is_seeded_and_about_its_size() {
        let texts: Vec<String> = (0..2000).map(|i| format!("query {i}")).collect();
        let n = texts.iter().filter(|t| held_out(t, 0.2, 1)).count();
        assert!((300..500).contains(&n), "{n} of 2000 at 0.2");
        let again = texts.iter().filter(|t| held_out(t, 0.2, 1)).count();
        assert_eq!(n, again);
        let other: Vec<bool> = texts.iter().map(|t| held_out(t, 0.2, 2)).collect();
        let same: Vec<bool> = texts.iter().map(|t| held_out(t, 0.2, 1)).collect();
        assert_ne!(other, same, "another seed holds out other texts");
    }
}
