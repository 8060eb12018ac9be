//! Workloads: CSV or JSONL files of (text, optional label, optional route), or synthetic requests.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub text: String,
    pub label: Option<String>,
    pub route: Option<String>,
}

/// Load a workload file: `.jsonl`/`.json` as JSON lines, anything else as CSV.
pub fn load(path: &Path) -> Result<Vec<Item>, String> {
    let raw = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read workload {}: {e}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let items = if matches!(ext, "jsonl" | "json" | "ndjson") {
        parse_jsonl(&raw)
    } else {
        parse_csv(&raw)
    }
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if items.is_empty() {
        return Err(format!("{}: no requests in the workload", path.display()));
    }
    Ok(items)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonItem {
    #[serde(alias = "prompt", alias = "content")]
    text: String,
    #[serde(default, alias = "category", alias = "intent")]
    label: Option<String>,
    #[serde(default, alias = "model")]
    route: Option<String>,
}

/// JSON lines: `{"text": …, "label": …?, "route": …?}`; blank lines are skipped.
pub fn parse_jsonl(raw: &str) -> Result<Vec<Item>, String> {
    let mut out = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let j: JsonItem = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        if j.text.trim().is_empty() {
            return Err(format!("line {}: empty text", i + 1));
        }
        out.push(Item {
            text: j.text,
            label: j.label.filter(|l| !l.is_empty()),
            route: j.route.filter(|r| !r.is_empty()),
        });
    }
    Ok(out)
}

/// Split CSV into records of fields (RFC 4180 quoting; newlines inside quotes allowed). Each record
/// carries its first line number.
fn csv_records(raw: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut records = Vec::new();
    let (mut field, mut fields) = (String::new(), Vec::new());
    let (mut quoted, mut line, mut start) = (false, 1usize, 1usize);
    let mut chars = raw.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() => {
                quoted = true;
                any = true;
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                any = true;
            }
            '\r' => {}
            '\n' => {
                if any || !field.is_empty() {
                    fields.push(std::mem::take(&mut field));
                    records.push((start, std::mem::take(&mut fields)));
                }
                any = false;
                line += 1;
                start = line;
            }
            _ => {
                field.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(format!("line {start}: unterminated quoted field"));
    }
    if any || !field.is_empty() {
        fields.push(field);
        records.push((start, fields));
    }
    Ok(records)
}

/// CSV: `text[,label[,route]]`, or any column order under a header naming `text` (and optionally
/// `label`/`category`/`intent`, `route`/`model`).
pub fn parse_csv(raw: &str) -> Result<Vec<Item>, String> {
    let records = csv_records(raw)?;
    let Some((_, first)) = records.first() else {
        return Ok(Vec::new());
    };
    let lower: Vec<String> = first
        .iter()
        .map(|f| f.trim().to_ascii_lowercase())
        .collect();
    let find = |names: &[&str]| lower.iter().position(|h| names.contains(&h.as_str()));
    let (cols, skip) = match find(&["text", "prompt", "utterance"]) {
        Some(t) => (
            (
                t,
                find(&["label", "category", "intent"]),
                find(&["route", "model"]),
            ),
            1,
        ),
        None => ((0, Some(1), Some(2)), 0),
    };
    let mut out = Vec::new();
    for (line, rec) in records.iter().skip(skip) {
        let get = |i: Option<usize>| {
            i.and_then(|i| rec.get(i))
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        let text = get(Some(cols.0)).ok_or_else(|| format!("line {line}: no text"))?;
        out.push(Item {
            text,
            label: get(cols.1),
            route: get(cols.2),
        });
    }
    Ok(out)
}

const SUBJECTS: &[&str] = &[
    "my card",
    "the transfer",
    "my account",
    "the payment",
    "my salary",
    "the refund",
    "my pin",
    "the app",
    "my loan",
    "the exchange rate",
];
const PREDICATES: &[&str] = &[
    "has not arrived",
    "was declined",
    "is blocked",
    "shows the wrong amount",
    "is missing",
    "was charged twice",
    "does not work abroad",
    "needs to be changed",
    "is pending since Monday",
    "looks suspicious",
];
const TAILS: &[&str] = &[
    "",
    " what should I do?",
    " can you help?",
    " please fix it",
    " since yesterday",
    " again",
];

/// Synthetic, unlabelled bank-support requests built from a seeded grammar.
pub fn synthetic(n: usize, seed: u64) -> Vec<Item> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5717);
    (0..n)
        .map(|_| Item {
            text: format!(
                "{} {}{}",
                SUBJECTS[rng.gen_range(0..SUBJECTS.len())],
                PREDICATES[rng.gen_range(0..PREDICATES.len())],
                TAILS[rng.gen_range(0..TAILS.len())]
            ),
            label: None,
            route: None,
        })
        .collect()
}

/// Picks items with a seed, uniformly or with a Zipf profile (`zipf`: the exponent s; the r-th item of a seeded
/// shuffle is drawn with probability ∝ r^-s): the same seed gives the same request sequence (so --compare
/// variants see the same workload).
pub struct Sampler {
    rng: StdRng,
    n: usize,
    /// Zipf: the shuffled order and the cumulative probabilities of its ranks.
    zipf: Option<(Vec<usize>, Vec<f64>)>,
}

impl Sampler {
    pub fn new(n: usize, seed: u64, zipf: Option<f64>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let zipf = zipf.map(|s| {
            let mut order: Vec<usize> = (0..n.max(1)).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            let w: Vec<f64> = (1..=order.len()).map(|r| (r as f64).powf(-s)).collect();
            let total: f64 = w.iter().sum();
            let mut acc = 0.0;
            let cdf = w
                .iter()
                .map(|x| {
                    acc += x / total;
                    acc
                })
                .collect();
            (order, cdf)
        });
        Self { rng, n, zipf }
    }

    pub fn next_index(&mut self) -> usize {
        match &self.zipf {
            None => self.rng.gen_range(0..self.n.max(1)),
            Some((order, cdf)) => {
                let u: f64 = self.rng.gen();
                order[cdf.partition_point(|c| *c < u).min(order.len() - 1)]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zipf_sampler_repeats_its_head_rows_and_is_seeded() {
        let draw = |seed| {
            let mut s = Sampler::new(1000, seed, Some(1.0));
            (0..5000).map(|_| s.next_index()).collect::<Vec<_>>()
        };
        let a = draw(3);
        assert_eq!(a, draw(3));
        let mut counts = std::collections::HashMap::new();
        for i in &a {
            *counts.entry(*i).or_insert(0usize) += 1;
        }
        let mut c: Vec<usize> = counts.values().copied().collect();
        c.sort_unstable_by(|x, y| y.cmp(x));
        // Rank 1 of Zipf(1) over 1000 is drawn with p = 1/H(1000) ≈ 0.134: some 670 of 5000.
        assert!((550..800).contains(&c[0]), "{}", c[0]);
        assert!(
            counts.len() < 900,
            "repeats: {} distinct of 5000",
            counts.len()
        );
    }

    #[test]
    fn csv_with_header_and_quotes() {
        let raw =
            "text,category\n\"hello, \"\"world\"\"\",greet\nplain text,other\n\n\"two\nlines\",x\n";
        let items = parse_csv(raw).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].text, "hello, \"world\"");
        assert_eq!(items[0].label.as_deref(), Some("greet"));
        assert_eq!(items[2].text, "two\nlines");
        assert_eq!(items[2].route, None);
    }

    #[test]
    fn csv_without_header_and_with_route_column() {
        let items = parse_csv("where is my card,card_not_arrived,classify\nhi\n").unwrap();
        assert_eq!(items[0].route.as_deref(), Some("classify"));
        assert_eq!(items[1].label, None);
        let items = parse_csv("label,text\nx,the text\n").unwrap();
        assert_eq!(items[0].text, "the text");
        assert_eq!(items[0].label.as_deref(), Some("x"));
    }

    #[test]
    fn csv_errors_name_the_line() {
        assert!(parse_csv("a,b\n\"open").unwrap_err().contains("line 2"));
        assert!(parse_csv("text,label\n,x\n")
            .unwrap_err()
            .contains("line 2: no text"));
    }

    #[test]
    fn jsonl() {
        let items =
            parse_jsonl("{\"text\":\"a\",\"label\":\"l\"}\n\n{\"prompt\":\"b\",\"model\":\"r\"}\n")
                .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].route.as_deref(), Some("r"));
        assert!(parse_jsonl("{\"text\":\"a\"}\n{oops}\n")
            .unwrap_err()
            .starts_with("line 2"));
        assert!(parse_jsonl("{\"text\":\"a\",\"extra\":1}").is_err());
        assert!(parse_jsonl("{\"text\":\"  \"}")
            .unwrap_err()
            .contains("empty text"));
    }

    #[test]
    fn sampling_and_synthetic_are_seeded() {
        let a: Vec<usize> = {
            let mut s = Sampler::new(10, 3, None);
            (0..50).map(|_| s.next_index()).collect()
        };
        let b: Vec<usize> = {
            let mut s = Sampler::new(10, 3, None);
            (0..50).map(|_| s.next_index()).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|&i| i < 10));
        assert_eq!(synthetic(5, 1), synthetic(5, 1));
        assert_ne!(synthetic(5, 1), synthetic(5, 2));
    }
}
