//! The whole output of one invocation: its runs, the comparison of policies, notes (`--json`, the HTML page).

use serde::Serialize;

use crate::report::RunReport;

/// The whole output of one invocation.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    pub url: String,
    pub route: String,
    pub runs: Vec<RunReport>,
    pub comparison: Option<Vec<crate::compare::Row>>,
    pub notes: Vec<String>,
}
