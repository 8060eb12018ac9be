//! `docs/architecture.md` held to the code: its crate table names every workspace crate in its folder, its
//! dependency list is each crate's `[dependencies]` on other tiergate crates exactly, its wings are the
//! engine's folders, and every `path::item` its "where does X live" table names is defined in that file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tiergate_tests::root;

fn page() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

/// The lines of `text` from the heading that starts with `heading` to the next heading.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(heading));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no section `{heading}`"));
    assert!(first.starts_with(heading));
    lines.take_while(|l| !l.starts_with("## ")).collect()
}

/// Each workspace member's package name and folder.
fn members() -> BTreeMap<String, String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = manifest
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap();
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|folder| {
            let toml = std::fs::read_to_string(root().join(folder).join("Cargo.toml")).unwrap();
            let name = toml
                .lines()
                .find_map(|l| l.strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .to_string();
            (name, folder.trim_end_matches('/').to_string())
        })
        .collect()
}

/// The tiergate crates a manifest's `[dependencies]` names, without the `tiergate-` prefix.
fn tiergate_deps(folder: &str) -> BTreeSet<String> {
    let toml = std::fs::read_to_string(root().join(folder).join("Cargo.toml")).unwrap();
    let mut in_deps = false;
    let mut out = BTreeSet::new();
    for l in toml.lines() {
        if l.starts_with('[') {
            in_deps = l.trim() == "[dependencies]";
        } else if in_deps {
            if let Some(rest) = l.strip_prefix("tiergate-") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn the_crate_table_names_every_crate_in_its_folder() {
    let text = page();
    let rows = section(&text, "## Crates");
    let mut table = BTreeMap::new();
    for l in rows.iter().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        let (name, folder) = (cells[1].trim_matches('`'), cells[2].trim_matches('`'));
        table.insert(name.to_string(), folder.trim_end_matches('/').to_string());
    }
    assert_eq!(table, members(), "the crate table against the workspace");
}

#[test]
fn the_dependency_list_is_each_manifests_own() {
    let text = page();
    let rows = section(&text, "## Crates");
    let listed: BTreeMap<String, BTreeSet<String>> = rows
        .iter()
        .filter_map(|l| l.split_once(" ──► "))
        .map(|(name, deps)| {
            let deps = deps
                .split(',')
                .map(str::trim)
                .filter(|d| *d != "(none)")
                .map(str::to_string)
                .collect();
            (name.trim().to_string(), deps)
        })
        .collect();
    assert!(listed.len() >= 10, "{listed:?}");
    let members = members();
    for (name, folder) in &members {
        let Some(short) = name.strip_prefix("tiergate-") else {
            continue;
        };
        if short == "tests" {
            continue; // its tiergate crates are dev-dependencies
        }
        let deps = listed
            .get(short)
            .unwrap_or_else(|| panic!("`{short}` is missing from the dependency list"));
        assert_eq!(
            deps,
            &tiergate_deps(folder),
            "the dependencies of `{short}`"
        );
    }
    // The check tells: a manifest of this tree has tiergate dependencies to compare.
    assert!(tiergate_deps("server").contains("engine"));
}

#[test]
fn the_wings_are_the_engines_folders() {
    let text = page();
    let rows = section(&text, "## The engine's wings");
    // The folder rows (`engine/src/<wing>/`); a file that is a layer of its own (`state.rs`) has a row too.
    let listed: BTreeSet<String> = rows
        .iter()
        .filter_map(|l| l.strip_prefix("| `engine/src/"))
        .filter_map(|l| l.split('`').next())
        .filter_map(|l| l.strip_suffix('/'))
        .map(str::to_string)
        .collect();
    let folders: BTreeSet<String> = std::fs::read_dir(root().join("engine/src"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(listed, folders);
    let lib = std::fs::read_to_string(root().join("engine/src/lib.rs")).unwrap();
    let modules = lib.lines().filter(|l| l.starts_with("pub mod ")).count();
    assert!(modules <= 14, "engine/src/lib.rs names {modules} modules");
    for wing in &folders {
        let m =
            std::fs::read_to_string(root().join("engine/src").join(wing).join("mod.rs")).unwrap();
        assert!(
            m.starts_with("//!"),
            "engine/src/{wing}/mod.rs says nothing of what lives there"
        );
    }
}

/// Whether `file`'s code defines `name` (a function, type, trait, constant or module, or implements it).
fn defines(code: &str, name: &str) -> bool {
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    words.windows(2).any(|w| {
        w[1] == name
            && [
                "fn", "struct", "enum", "trait", "type", "const", "static", "mod", "impl", "for",
            ]
            .contains(&w[0])
    })
}

/// `path::A::{b, c}` as the file and each item path (`["A", "b"]`, `["A", "c"]`).
fn expand(span: &str) -> Option<(String, Vec<Vec<String>>)> {
    let (file, items) = span.split_once(".rs::")?;
    let file = format!("{file}.rs");
    let (prefix, group) = match items.split_once("::{") {
        Some((p, g)) => (Some(p), g.trim_end_matches('}')),
        None => match items.strip_prefix('{') {
            Some(g) => (None, g.trim_end_matches('}')),
            None => (None, items),
        },
    };
    let paths = group
        .split(',')
        .map(|i| {
            prefix
                .into_iter()
                .flat_map(|p| p.split("::"))
                .chain(i.trim().split("::"))
                .map(str::to_string)
                .collect()
        })
        .collect();
    Some((file, paths))
}

/// For a `path.rs::item` span, asserts that the file defines each item it names and returns how many items it
/// named; `None` for any other span.
fn items_defined(span: &str) -> Option<usize> {
    let (file, paths) = expand(span)?;
    let code = std::fs::read_to_string(root().join(&file))
        .unwrap_or_else(|_| panic!("{file} (named on the page) is gone"));
    for p in &paths {
        for name in p {
            assert!(
                defines(&code, name),
                "{file} defines no `{name}` ({})",
                p.join("::")
            );
        }
    }
    Some(paths.len())
}

#[test]
fn every_item_the_where_table_names_is_defined_there() {
    let text = page();
    let rows = section(&text, "## Where does X live");
    let mut checked = 0;
    for row in rows
        .iter()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| behaviour"))
    {
        for span in row.split('`').skip(1).step_by(2) {
            if let Some(n) = items_defined(span) {
                checked += n;
            } else if span.ends_with(".rs") {
                assert!(Path::new(&root().join(span)).is_file(), "{span} is gone");
            }
        }
    }
    assert!(checked >= 30, "only {checked} items checked");
    // The check tells: a name the file does not define is caught, and braces expand.
    let (f, p) = expand("engine/src/load/brownout.rs::Step::{generates, reranks}").unwrap();
    assert_eq!(f, "engine/src/load/brownout.rs");
    assert_eq!(p, vec![vec!["Step", "generates"], vec!["Step", "reranks"]]);
    assert!(!defines("fn other() {}", "gone") && defines("pub async fn gone() {}", "gone"));
}

/// Every `path.rs::item` span on the page — the narrative, the wings, the where table — names an item that
/// file defines, and every `dir/file.rs` span is a file: a path that moved fails here.
#[test]
fn every_path_item_on_the_page_is_defined_there() {
    let text = page();
    let mut checked = 0;
    let mut files = 0;
    for span in text.split('`').skip(1).step_by(2) {
        if let Some(n) = items_defined(span) {
            checked += n;
        } else if span.ends_with(".rs") && span.contains('/') && !span.contains(' ') {
            let rooted = root().join(span).is_file();
            let under_engine = root().join("engine/src").join(span).is_file();
            assert!(rooted || under_engine, "{span} (named on the page) is gone");
            files += 1;
        }
    }
    assert!(
        checked >= 60 && files >= 30,
        "only {checked} items and {files} files checked"
    );
}

/// The config examples the README and docs/configuration.md print are whole files as printed: each loads
/// (it `extends` the example) and resolves.
#[test]
fn the_printed_config_examples_are_complete_files() {
    for (page, heading) in [
        ("README.md", "### Several LLMs, one deadline"),
        ("docs/configuration.md", "## Configuration"),
    ] {
        let text = std::fs::read_to_string(root().join(page)).unwrap();
        let from = text
            .find(heading)
            .unwrap_or_else(|| panic!("{page}: {heading}"));
        let block = text[from..]
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap_or_else(|| panic!("{page}: no toml block under {heading}"));
        let block: String = block
            .lines()
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        assert!(block.contains("extends = \"example\""), "{page}: {block}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiergate.toml");
        std::fs::write(&path, &block).unwrap();
        let cfg = tiergate_config::load(Some(&path), Vec::new(), &[])
            .unwrap_or_else(|e| panic!("{page}: {e}\n{block}"));
        cfg.resolve().unwrap_or_else(|e| panic!("{page}: {e}"));
    }
}
