//! The config crate's one error type.

use std::path::PathBuf;

/// Why a configuration could not be loaded or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The TOML (file, env value or `--set` value) does not parse or does not match the schema.
    #[error("invalid config ({origin}): {message}")]
    Parse { origin: String, message: String },
    /// A field holds a value outside its allowed range.
    #[error("invalid value for `{field}`: {message}")]
    Invalid { field: String, message: String },
    /// A config file is not valid, and it leaves out sections the embedded default has: the file replaces
    /// the default, it is not layered over it.
    #[error(
        "{cause}\n{path} replaces the embedded default config (it is not layered over it) and sets no {lacks}: \
         start from the default (`tiergate config --default > tiergate.toml`), add what {path} holds, and serve \
         with `--config tiergate.toml`"
    )]
    Replaces {
        path: PathBuf,
        lacks: String,
        cause: Box<ConfigError>,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
