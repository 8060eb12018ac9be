//! Typed tiergate configuration: the schema, its defaults (written once, here), loading from TOML with
//! environment and command-line overrides, and validation with messages that name the field.
//!
//! This crate owns no behaviour and must not depend on any other tiergate crate. It never reads the process
//! environment itself: `main` passes the variables in.

mod error;
mod load;
mod prefilter;

pub use error::ConfigError;
pub use load::{load, DEFAULT_CONFIG, ENV_PREFIX};
pub use prefilter::{FewShotLabel, HeadConfig, PoolingConfig, PrefilterConfig, TrainedHeadConfig};

use serde::{Deserialize, Serialize};

/// The whole tiergate configuration. Later sections (server, routing, reranker) are added by their issues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The Tier-0 encoder classifier.
    pub prefilter: PrefilterConfig,
}

impl Config {
    /// Checks every field; the first problem found is returned with the field's dotted path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.prefilter.validate("prefilter")
    }
}
