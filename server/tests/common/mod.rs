//! What the server's integration tests share: a tiny few-shot classifier config (no download) and the stub
//! worker program of this workspace.

#![allow(dead_code)] // each test file uses its own part

pub mod rig;

use std::path::PathBuf;

/// The stub worker binary (`cargo test --workspace` builds it: target/<profile>/, above this test's deps/).
pub fn worker_program() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().and_then(std::path::Path::parent);
    let p = dir
        .unwrap_or(std::path::Path::new("."))
        .join("tiergate-reranker");
    assert!(
        p.is_file(),
        "{} not built: run `cargo test --workspace`",
        p.display()
    );
    p
}

pub use tiergate_engine::testing::config;
