//! Support for the end-to-end tests in `tests/tests/`: where the models, the data and the built binaries are.
//! The tests run real binaries on real models; `scripts/test.sh` fetches the models first.

use std::path::{Path, PathBuf};

/// The workspace root. Read at run time (cargo sets `CARGO_MANIFEST_DIR` for tests): a path baked in at
/// compile time would point at whichever clone last built this crate in a shared target directory.
pub fn root() -> PathBuf {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    Path::new(&manifest)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The MiniLM folder; fails with a pointer to the fetch script when it is missing.
pub fn minilm_dir() -> PathBuf {
    let dir = root().join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run scripts/fetch-models.sh first",
        dir.display()
    );
    dir
}

/// The Qwen2.5-Coder-0.5B judge's file (`scripts/fetch-models.sh --judge qwen2.5-0.5b`, which
/// `scripts/test.sh` runs): the tests that need it run under `--features real`, where a missing file is a
/// failure, never a silent pass.
pub fn qwen_judge() -> PathBuf {
    let p =
        root().join("models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} not fetched: run scripts/fetch-models.sh --judge qwen2.5-0.5b",
        p.display()
    );
    p
}

/// A binary of this workspace built next to the running test (`scripts/test.sh` builds them all before the
/// tests: `cargo test` alone builds only the binaries of packages with integration tests of their own).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} not built: run the tests with scripts/test.sh (or `cargo build --workspace --bins` first)",
        bin.display()
    );
    bin
}
