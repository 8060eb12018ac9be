//! `calibration.json` next to a trained head: the labelled rows `mode = "risk"` bounds Tier-0's error with.
//! `tiergate train` halves its dev split (every other row of each label): the first half fits the
//! temperature and orders the θ grid, the second half, which neither saw, holds the calibration rows and the
//! dev figures. Each row is only Tier-0's ambiguity and whether its answer was wrong: no text.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tiergate_core::risk::Row;

use crate::encoder::read_json;
use crate::error::{PrefilterError, Result};

/// Current `calibration.json` format.
pub const CALIBRATION_FORMAT: u32 = 1;

/// `calibration.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CalibrationRows {
    /// Format version of this file.
    pub format: u32,
    /// The temperature the ambiguities were computed with (the head's).
    pub temperature: f64,
    /// Rows of the half that fitted the temperature, `[ambiguity, wrong]`: they order the θ grid only.
    pub ordering: Vec<(f64, bool)>,
    /// Rows neither the head nor its temperature saw, `[ambiguity, wrong]`: what the bound is computed on.
    pub rows: Vec<(f64, bool)>,
    /// The dev split was too small for two disjoint halves (no label had two dev rows): `rows` are the rows
    /// that fitted the temperature and ordered the grid — in-sample, so the bound's proof does not hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_sample: bool,
    /// Labels with dev rows but none among `rows` (a label's one dev row goes to the temperature's half): the
    /// rows do not sample the traffic of these labels.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub labels_left_out: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn to_rows(v: &[(f64, bool)]) -> Vec<Row> {
    v.iter()
        .map(|&(ambiguity, wrong)| Row { ambiguity, wrong })
        .collect()
}

/// Why calibration rows with these properties are not the held-out sample the bound's proof needs (`None`:
/// sound): in-sample halves, or labels with no calibration row. What `train` warns and `head.json` records.
pub fn flaw(in_sample: bool, labels_left_out: usize) -> Option<String> {
    if in_sample {
        return Some(
            "in-sample: the dev split was too small for disjoint halves, so the calibration rows are the rows \
             that fitted the temperature (train with more dev rows: --dev-fraction, or more rows per label)"
                .into(),
        );
    }
    (labels_left_out > 0).then(|| {
        format!(
            "{labels_left_out} labels have no calibration row (one dev row each, used to fit the temperature): \
             the rows do not sample their traffic"
        )
    })
}

impl CalibrationRows {
    /// File name inside the head folder.
    pub const FILE: &'static str = "calibration.json";

    /// The ordering rows as [`Row`]s.
    pub fn ordering_rows(&self) -> Vec<Row> {
        to_rows(&self.ordering)
    }

    /// The calibration rows as [`Row`]s.
    pub fn calibration_rows(&self) -> Vec<Row> {
        to_rows(&self.rows)
    }

    /// Why the rows are not the held-out sample the bound's proof needs, when they are not (`None`: sound).
    pub fn flaw(&self) -> Option<String> {
        flaw(self.in_sample, self.labels_left_out)
    }

    /// Reads `dir/calibration.json` when present (heads trained before it, checkpoint and few-shot heads have
    /// none); a file whose ambiguities are outside [0, 1] is corrupt.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(Self::FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let c: Self = read_json(&path)?;
        let ok = |v: &[(f64, bool)]| {
            v.iter()
                .all(|(a, _)| a.is_finite() && (0.0..=1.0).contains(a))
        };
        if c.format != CALIBRATION_FORMAT || !ok(&c.rows) || !ok(&c.ordering) {
            return Err(PrefilterError::corrupt(
                &path,
                format!("format must be {CALIBRATION_FORMAT} and every ambiguity in [0, 1]"),
            ));
        }
        Ok(Some(c))
    }

    /// Writes `dir/calibration.json`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(Self::FILE);
        let text = serde_json::to_string(self).map_err(|e| PrefilterError::corrupt(&path, e))?;
        std::fs::write(&path, text).map_err(|e| PrefilterError::file(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_ambiguities_outside_the_unit_interval() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(CalibrationRows::load(dir.path()).unwrap(), None);
        let c = CalibrationRows {
            format: CALIBRATION_FORMAT,
            temperature: 1.5,
            ordering: vec![(0.1, false)],
            rows: vec![(0.2, true), (0.0, false)],
            in_sample: false,
            labels_left_out: 0,
        };
        c.save(dir.path()).unwrap();
        let back = CalibrationRows::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, c);
        assert_eq!(
            back.calibration_rows()[0],
            Row {
                ambiguity: 0.2,
                wrong: true
            }
        );
        let bad = CalibrationRows {
            rows: vec![(1.5, false)],
            ..c
        };
        bad.save(dir.path()).unwrap();
        let err = CalibrationRows::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("[0, 1]"), "{err}");
    }
}
