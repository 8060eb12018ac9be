//! Checks of the worker's model made once, before any worker starts: a missing file or an architecture the
//! scoring forward does not run is an error at start that names the file, not a worker restart loop.
//!
//! Reads only the GGUF header with candle's reader (already built for the prefilter); the tensors stay on
//! disk and the server needs no LLM library.

use std::path::Path;

/// Architectures the worker's scoring forward runs.
pub(crate) const SCORING_ARCHITECTURES: &[&str] = &["llama", "qwen2"];

/// Why a model cannot serve.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PreflightError {
    /// No such file or folder.
    #[error("model {path} not found{hint}")]
    Missing { path: String, hint: String },
    /// Not a readable GGUF file.
    #[error("model {path} is not a readable GGUF file: {why}")]
    Unreadable { path: String, why: String },
    /// A GGUF file the scoring forward cannot run.
    #[error("model {path}: architecture `{arch}` is not supported by the scoring forward ({})", SCORING_ARCHITECTURES.join(", "))]
    Architecture { path: String, arch: String },
}

/// Checks a `mistralrs` engine's model: it exists, and a `.gguf` file is of a supported architecture.
pub(crate) fn check_local_model(path: &Path) -> Result<(), PreflightError> {
    let shown = path.display().to_string();
    if !path.exists() {
        let name = shown.to_lowercase();
        let hint = if name.contains("qwen2.5-coder-0.5b") {
            ": run scripts/fetch-models.sh --judge qwen2.5-0.5b"
        } else if name.contains("qwen2.5-coder-1.5b") {
            ": run scripts/fetch-models.sh --judge qwen2.5-1.5b"
        } else {
            ": run scripts/fetch-models.sh (or set reranker.model)"
        };
        return Err(PreflightError::Missing {
            path: shown,
            hint: hint.into(),
        });
    }
    if path.is_dir() {
        return Ok(());
    }
    let arch = gguf_architecture(path).map_err(|why| PreflightError::Unreadable {
        path: shown.clone(),
        why,
    })?;
    if SCORING_ARCHITECTURES.contains(&arch.as_str()) {
        Ok(())
    } else {
        Err(PreflightError::Architecture { path: shown, arch })
    }
}

/// `general.architecture` of a GGUF file.
pub(crate) fn gguf_architecture(path: &Path) -> Result<String, String> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| e.to_string())?);
    let ct = candle_core::quantized::gguf_file::Content::read(&mut f).map_err(|e| e.to_string())?;
    match ct.metadata.get("general.architecture") {
        Some(v) => v.to_string().cloned().map_err(|e| e.to_string()),
        None => Err("no general.architecture".into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    /// A GGUF header with an array of strings and a u32 before the architecture.
    fn header(arch: &str) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "bc");
        string(&mut b, "x.count");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, arch);
        b
    }

    #[test]
    fn reads_the_architecture_and_refuses_what_the_forward_cannot_run() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("q.gguf");
        std::fs::write(&ok, header("qwen2")).unwrap();
        assert_eq!(gguf_architecture(&ok).unwrap(), "qwen2");
        check_local_model(&ok).unwrap();
        let gemma = dir.path().join("g.gguf");
        std::fs::write(&gemma, header("gemma3")).unwrap();
        let e = check_local_model(&gemma).unwrap_err().to_string();
        assert!(e.contains("g.gguf") && e.contains("gemma3"), "{e}");
        let junk = dir.path().join("j.gguf");
        std::fs::write(&junk, b"not a model").unwrap();
        assert!(check_local_model(&junk)
            .unwrap_err()
            .to_string()
            .contains("j.gguf"));
        let missing = dir.path().join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
        let e = check_local_model(&missing).unwrap_err().to_string();
        assert!(e.contains("--judge qwen2.5-1.5b"), "{e}");
    }
}
