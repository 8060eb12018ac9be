//! Checks of the worker's model made once, before any worker starts: a missing file or an architecture the
//! scoring forward does not run is an error at start that names the file, not a worker restart loop.
//!
//! Reads only the GGUF header (magic, version, metadata keys up to `general.architecture`); the tensors stay
//! on disk and the server needs no model library.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// Architectures the worker's scoring forward runs.
pub const SCORING_ARCHITECTURES: &[&str] = &["llama", "qwen2"];

/// Why a model cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
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
pub fn check_local_model(path: &Path) -> Result<(), PreflightError> {
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
pub fn gguf_architecture(path: &Path) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(f);
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic).map_err(|e| e.to_string())?;
    if &magic != b"GGUF" {
        return Err("no GGUF magic".into());
    }
    let version = read_u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} (2 or 3 expected)"));
    }
    let _tensors = read_u64(&mut r)?;
    let kvs = read_u64(&mut r)?;
    for _ in 0..kvs {
        let key = read_string(&mut r)?;
        let ty = read_u32(&mut r)?;
        if key == "general.architecture" {
            if ty != 8 {
                return Err("general.architecture is not a string".into());
            }
            return read_string(&mut r);
        }
        skip_value(&mut r, ty)?;
    }
    Err("no general.architecture".into())
}

fn read_u32(r: &mut impl Read) -> Result<u32, String> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(|e| e.to_string())?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> Result<u64, String> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).map_err(|e| e.to_string())?;
    Ok(u64::from_le_bytes(b))
}

/// Longest metadata string read into memory (keys and the architecture name are short).
const MAX_STRING: u64 = 1 << 16;

fn read_string(r: &mut impl Read) -> Result<String, String> {
    let n = read_u64(r)?;
    if n > MAX_STRING {
        return Err(format!("metadata string of {n} bytes"));
    }
    let mut b = vec![0u8; n as usize];
    r.read_exact(&mut b).map_err(|e| e.to_string())?;
    String::from_utf8(b).map_err(|e| e.to_string())
}

/// Bytes of a fixed-size GGUF value type; None for strings and arrays.
fn fixed_size(ty: u32) -> Result<Option<u64>, String> {
    Ok(match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        8 | 9 => None,
        other => return Err(format!("unknown metadata type {other}")),
    })
}

fn skip_value<R: Read + Seek>(r: &mut R, ty: u32) -> Result<(), String> {
    if let Some(n) = fixed_size(ty)? {
        return seek(r, n);
    }
    if ty == 8 {
        let n = read_u64(r)?;
        return seek(r, n);
    }
    let item = read_u32(r)?;
    let count = read_u64(r)?;
    match fixed_size(item)? {
        Some(n) => seek(r, n.saturating_mul(count)),
        None => {
            for _ in 0..count {
                skip_value(r, item)?;
            }
            Ok(())
        }
    }
}

fn seek<R: Seek>(r: &mut R, n: u64) -> Result<(), String> {
    let n = i64::try_from(n).map_err(|_| "metadata value too large".to_string())?;
    r.seek(SeekFrom::Current(n))
        .map(|_| ())
        .map_err(|e| e.to_string())
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
