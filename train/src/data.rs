//! Labelled text files for training and evaluation: CSV with a header row, or JSONL with `text`/`label`.

use std::path::{Path, PathBuf};

use tiergate_prefilter::error::{PrefilterError, Result};

/// One labelled example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The input text.
    pub text: String,
    /// The gold label.
    pub label: String,
}

/// How to read a data file.
#[derive(Debug, Clone)]
pub struct DataSpec {
    /// The file (`.jsonl`/`.ndjson` is JSON lines; anything else is CSV).
    pub path: PathBuf,
    /// CSV column with the text.
    pub text_column: String,
    /// CSV column with the label.
    pub label_column: String,
    /// Skip and count bad rows instead of failing on the first one.
    pub skip_bad_rows: bool,
}

impl DataSpec {
    /// CSV columns `text` and `category` (Banking77's), failing on bad rows.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            text_column: "text".into(),
            label_column: "category".into(),
            skip_bad_rows: false,
        }
    }
}

/// Rows read from a file.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Good rows, in file order.
    pub examples: Vec<Example>,
    /// Bad rows skipped (only with `skip_bad_rows`).
    pub skipped: usize,
}

/// Reads a data file.
pub fn read(spec: &DataSpec) -> Result<Dataset> {
    let ext = spec
        .path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let text =
        std::fs::read_to_string(&spec.path).map_err(|e| PrefilterError::file(&spec.path, e))?;
    let mut out = Dataset {
        examples: Vec::new(),
        skipped: 0,
    };
    let mut bad = |line: usize, message: String| -> Result<()> {
        if spec.skip_bad_rows {
            out.skipped += 1;
            Ok(())
        } else {
            Err(data_error(&spec.path, line, message))
        }
    };
    let mut good = Vec::new();
    if ext == "jsonl" || ext == "ndjson" {
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            match parse_json_row(raw) {
                Ok(ex) => good.push(ex),
                Err(m) => bad(i + 1, m)?,
            }
        }
    } else {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .from_reader(text.as_bytes());
        let headers = reader
            .headers()
            .map_err(|e| data_error(&spec.path, 1, format!("cannot read the header row: {e}")))?
            .clone();
        let col = |name: &str| {
            headers
                .iter()
                .position(|h| h.trim() == name)
                .ok_or_else(|| {
                    data_error(
                        &spec.path,
                        1,
                        format!(
                            "no column `{name}` in the header (columns: {})",
                            headers.iter().collect::<Vec<_>>().join(", ")
                        ),
                    )
                })
        };
        let (ti, li) = (col(&spec.text_column)?, col(&spec.label_column)?);
        for record in reader.records() {
            let (line, row) = match record {
                Ok(r) => (r.position().map_or(0, |p| p.line() as usize), Ok(r)),
                Err(e) => (
                    e.position().map_or(0, |p| p.line() as usize),
                    Err(e.to_string()),
                ),
            };
            let parsed = row.and_then(|r| {
                let text = r.get(ti).unwrap_or("").trim();
                let label = r.get(li).unwrap_or("").trim();
                check(text, label)
            });
            match parsed {
                Ok(ex) => good.push(ex),
                Err(m) => bad(line, m)?,
            }
        }
    }
    out.examples = good;
    if out.examples.is_empty() {
        return Err(data_error(&spec.path, 0, "no usable rows".into()));
    }
    Ok(out)
}

fn parse_json_row(raw: &str) -> std::result::Result<Example, String> {
    let v: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("invalid JSON: {e}"))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::trim)
            .ok_or_else(|| format!("missing string field `{k}`"))
    };
    check(field("text")?, field("label")?)
}

fn check(text: &str, label: &str) -> std::result::Result<Example, String> {
    if text.is_empty() {
        return Err("empty text".into());
    }
    if label.is_empty() {
        return Err("empty label".into());
    }
    Ok(Example {
        text: text.to_string(),
        label: label.to_string(),
    })
}

fn data_error(path: &Path, line: usize, message: String) -> PrefilterError {
    PrefilterError::Data {
        path: path.to_path_buf(),
        line,
        message,
    }
}

/// One line of a labels file (`tiergate train --labels`): a label and its optional one-sentence description.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelLine {
    pub name: String,
    pub description: Option<String>,
}

/// Reads a labels file: one label per line, optionally a tab and a one-sentence description; blank lines and
/// lines starting with `#` are skipped. An empty name, a duplicate or fewer than two labels are refused with
/// the line.
pub fn read_labels(path: &Path) -> Result<Vec<LabelLine>> {
    let raw = std::fs::read_to_string(path).map_err(|e| PrefilterError::file(path, e))?;
    let mut out: Vec<LabelLine> = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (name, description) = match line.split_once('\t') {
            Some((n, d)) => (n.trim(), Some(d.trim()).filter(|d| !d.is_empty())),
            None => (line.trim(), None),
        };
        if name.is_empty() {
            return Err(data_error(path, i + 1, "empty label name".into()));
        }
        if out.iter().any(|l| l.name == name) {
            return Err(data_error(path, i + 1, format!("duplicate label `{name}`")));
        }
        out.push(LabelLine {
            name: name.to_string(),
            description: description.map(str::to_string),
        });
    }
    if out.len() < 2 {
        return Err(data_error(
            path,
            0,
            format!("needs at least two labels, has {}", out.len()),
        ));
    }
    Ok(out)
}

/// Holds the rows to a labels file: a row whose label the file does not name is refused (the out-of-scope
/// label aside), and a label of the file with no training row gets one, its description (or its name as the
/// LLM reads it), so every label of the file is a label of the head. Returns the rows added.
pub fn hold_to_labels(
    file: &[LabelLine],
    train: &mut Vec<Example>,
    dev: &[Example],
    oos_label: Option<&str>,
    path: &Path,
) -> Result<usize> {
    if let Some(e) = train
        .iter()
        .chain(dev)
        .find(|e| Some(e.label.as_str()) != oos_label && !file.iter().any(|l| l.name == e.label))
    {
        return Err(PrefilterError::Training(format!(
            "a row has label `{}`, which {} does not name",
            e.label,
            path.display()
        )));
    }
    let mut added = 0;
    for l in file {
        if !train.iter().any(|e| e.label == l.name) {
            let text = l
                .description
                .clone()
                .unwrap_or_else(|| tiergate_config::display_label(&l.name));
            train.push(Example {
                text,
                label: l.name.clone(),
            });
            added += 1;
        }
    }
    Ok(added)
}

/// At most `k` rows of each label, drawn at random with `seed` (a label with fewer keeps all of its rows), in
/// the data's order: the labelled examples a route starts from (`tiergate train --per-label K`).
pub fn per_label(examples: &[Example], k: usize, seed: u64) -> Vec<Example> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut by_label: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, e) in examples.iter().enumerate() {
        by_label.entry(e.label.as_str()).or_default().push(i);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kept: Vec<usize> = by_label
        .into_values()
        .flat_map(|mut rows| {
            rows.shuffle(&mut rng);
            rows.truncate(k);
            rows
        })
        .collect();
    kept.sort_unstable();
    kept.into_iter().map(|i| examples[i].clone()).collect()
}

/// A deterministic stratified split: about `dev_fraction` of each label goes to dev (at least one row of
/// every label with two or more rows).
pub fn split(examples: &[Example], dev_fraction: f64, seed: u64) -> (Vec<Example>, Vec<Example>) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut by_label: std::collections::BTreeMap<&str, Vec<&Example>> = Default::default();
    for e in examples {
        by_label.entry(e.label.as_str()).or_default().push(e);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut train, mut dev) = (Vec::new(), Vec::new());
    for (_, mut rows) in by_label {
        rows.shuffle(&mut rng);
        let k = if rows.len() >= 2 {
            ((rows.len() as f64 * dev_fraction).round() as usize).clamp(1, rows.len() - 1)
        } else {
            0
        };
        dev.extend(rows[..k].iter().map(|e| (*e).clone()));
        train.extend(rows[k..].iter().map(|e| (*e).clone()));
    }
    train.shuffle(&mut rng);
    (train, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn per_label_keeps_at_most_k_of_each_label_by_its_seed() {
        let rows: Vec<Example> = (0..30)
            .map(|i| Example {
                text: format!("row {i}"),
                label: if i < 25 { ["a", "b"][i % 2] } else { "c" }.to_string(),
            })
            .collect();
        let kept = per_label(&rows, 4, 7);
        let count = |l: &str| kept.iter().filter(|e| e.label == l).count();
        assert_eq!((count("a"), count("b"), count("c")), (4, 4, 4));
        // A label with fewer rows keeps them all; the data's order stays.
        assert_eq!(
            per_label(&rows, 6, 7)
                .iter()
                .filter(|e| e.label == "c")
                .count(),
            5
        );
        let at = |v: &[Example]| v.iter().map(|e| e.text.clone()).collect::<Vec<_>>();
        let mut sorted = at(&kept);
        sorted.sort_by_key(|t| t[4..].parse::<usize>().unwrap());
        assert_eq!(at(&kept), sorted);
        // The same seed draws the same rows, another seed other rows.
        assert_eq!(at(&per_label(&rows, 4, 7)), at(&kept));
        assert_ne!(at(&per_label(&rows, 4, 8)), at(&kept));
        assert!(per_label(&rows, 0, 7).is_empty());
    }

    #[test]
    fn csv_with_quotes_and_custom_columns() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "a.csv",
            "id,utterance,intent\n1,\"hello, there\",greet\n2,bye,leave\n",
        );
        let mut spec = DataSpec::new(p);
        spec.text_column = "utterance".into();
        spec.label_column = "intent".into();
        let ds = read(&spec).unwrap();
        assert_eq!(ds.examples.len(), 2);
        assert_eq!(ds.examples[0].text, "hello, there");
        assert_eq!(ds.examples[1].label, "leave");
    }

    #[test]
    fn bad_row_fails_with_line_number_or_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "a.csv", "text,category\nok,a\n,b\nfine,c\n");
        let err = read(&DataSpec::new(&p)).unwrap_err();
        assert!(err.to_string().contains("a.csv:3: empty text"), "{err}");
        let mut spec = DataSpec::new(&p);
        spec.skip_bad_rows = true;
        let ds = read(&spec).unwrap();
        assert_eq!((ds.examples.len(), ds.skipped), (2, 1));
    }

    #[test]
    fn missing_column_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "a.csv", "sentence,category\nok,a\n");
        let err = read(&DataSpec::new(&p)).unwrap_err();
        assert!(err.to_string().contains("no column `text`"), "{err}");
    }

    #[test]
    fn jsonl_rows_and_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "a.jsonl",
            "{\"text\":\"hi\",\"label\":\"greet\"}\n\n{\"text\":\"x\"}\nnot json\n",
        );
        let err = read(&DataSpec::new(&p)).unwrap_err();
        assert!(
            err.to_string()
                .contains("a.jsonl:3: missing string field `label`"),
            "{err}"
        );
        let mut spec = DataSpec::new(&p);
        spec.skip_bad_rows = true;
        let ds = read(&spec).unwrap();
        assert_eq!((ds.examples.len(), ds.skipped), (1, 2));
    }

    #[test]
    fn split_is_stratified_and_deterministic() {
        let ex: Vec<Example> = (0..100)
            .map(|i| Example {
                text: format!("t{i}"),
                label: format!("l{}", i % 4),
            })
            .collect();
        let (train, dev) = split(&ex, 0.2, 1);
        assert_eq!(train.len() + dev.len(), 100);
        assert_eq!(dev.len(), 20);
        for l in 0..4 {
            assert_eq!(dev.iter().filter(|e| e.label == format!("l{l}")).count(), 5);
        }
        assert_eq!(split(&ex, 0.2, 1).1, dev, "same seed, same split");
    }
}
