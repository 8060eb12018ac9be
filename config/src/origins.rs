//! Where each config value came from, and how a file builds on a base (`extends`).
//!
//! Layers, each over the one before: the schema's documented defaults, then the base a file `extends` (the
//! embedded example, `extends = "example"`, or another file, relative to the one that names it), then the file,
//! then `TIERGATE__…` variables, then `--set`. A layer merges into the one below table by table, except that a
//! tagged table (one with a `kind`, such as `prefilter.head`) and an array (`[[llm]]`, `[[routes]]`,
//! `[[tenants]]`, any list) replace what they name whole.

use std::collections::BTreeMap;

use toml::{Table, Value};

/// The layer that set each path (dotted; an array or a tagged table is one entry).
#[derive(Debug, Default, Clone)]
pub struct Origins(BTreeMap<String, String>);

impl Origins {
    /// Records that `layer` set `value` at `path`: whatever was recorded under it goes.
    pub fn mark(&mut self, path: &str, value: &Value, layer: &str) {
        let under = format!("{path}.");
        self.0.retain(|k, _| k != path && !k.starts_with(&under));
        match value {
            Value::Table(t) if !tagged(t) => {
                for (k, v) in t {
                    self.mark(&join(path, k), v, layer);
                }
            }
            _ => {
                self.0.insert(path.to_string(), layer.to_string());
            }
        }
    }

    /// The layer of `path`: its own entry or its nearest recorded parent's, else the schema's default.
    pub fn of(&self, path: &str) -> &str {
        let mut p = path;
        loop {
            if let Some(l) = self.0.get(p) {
                return l;
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return "default",
            }
        }
    }
}

/// A table that stands for one variant of a tagged enum: replaced whole, never merged key by key.
fn tagged(t: &Table) -> bool {
    t.contains_key("kind")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Merges `over` into `base` (tables key by key; tagged tables and arrays replace whole), recording `layer`.
pub fn merge(base: &mut Table, over: Table, at: &str, layer: &str, origins: &mut Origins) {
    for (k, v) in over {
        let path = join(at, &k);
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o)) if !tagged(&o) && !tagged(b) => {
                merge(b, o, &path, layer, origins);
            }
            (_, v) => {
                origins.mark(&path, &v, layer);
                base.insert(k, v);
            }
        }
    }
}

/// Every leaf of `v` (arrays whole) with its dotted path, in order.
pub fn leaves(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Table(t) => {
            for (k, v) in t {
                leaves(v, &join(at, k), out);
            }
        }
        other => out.push((at.to_string(), other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Table {
        s.parse().unwrap()
    }

    #[test]
    fn tables_merge_and_tagged_tables_and_arrays_replace() {
        let mut origins = Origins::default();
        let mut base = t("a = 1\n[s]\nx = 1\ny = 2\n[h]\nkind = \"few\"\nlabels = 3\n[[r]]\nn = 1\n[[r]]\nn = 2\n");
        origins.mark("", &Value::Table(base.clone()), "base");
        let over = t("[s]\ny = 5\n[h]\nkind = \"trained\"\ndir = \"d\"\n[[r]]\nn = 9\n");
        merge(&mut base, over, "", "file", &mut origins);
        assert_eq!(base["s"]["x"].as_integer(), Some(1), "merged key by key");
        assert_eq!(base["s"]["y"].as_integer(), Some(5));
        assert!(
            base["h"].get("labels").is_none(),
            "a tagged table replaces whole"
        );
        assert_eq!(
            base["r"].as_array().unwrap().len(),
            1,
            "an array replaces whole"
        );
        assert_eq!(origins.of("s.x"), "base");
        assert_eq!(origins.of("s.y"), "file");
        assert_eq!(origins.of("h.dir"), "file");
        assert_eq!(origins.of("r"), "file");
        assert_eq!(origins.of("a"), "base");
        assert_eq!(origins.of("never.set"), "default");
    }
}
