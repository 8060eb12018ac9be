//! The routes by name, each swappable whole: a request takes its route once ([`RouteTable::get`], an `Arc`)
//! and keeps it to the end, so a head promoted meanwhile (a live head swap) is never half seen.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::routing::route::Route;

/// Routes by name.
pub(crate) struct RouteTable {
    map: HashMap<String, RwLock<Arc<Route>>>,
}

impl RouteTable {
    pub(crate) fn new(routes: HashMap<String, Route>) -> Self {
        Self {
            map: routes
                .into_iter()
                .map(|(k, r)| (k, RwLock::new(Arc::new(r))))
                .collect(),
        }
    }

    /// The route a client's `model` names: a route's own name; else an exact alias; else the first glob
    /// alias that matches (routes by name, so the order is the same on every replica); else `auto` names the
    /// steered route (the first by name, when one exists); else the route that answers unknown names. `None`:
    /// no route answers it (404).
    pub(crate) fn resolve(&self, model: &str) -> Option<String> {
        if self.map.contains_key(model) {
            return Some(model.to_string());
        }
        let mut routes: Vec<(String, Arc<Route>)> = self.iter().collect();
        routes.sort_by(|a, b| a.0.cmp(&b.0));
        let exact = routes
            .iter()
            .find(|(_, r)| r.aliases.iter().any(|a| a == model));
        let glob = || {
            routes.iter().find(|(_, r)| {
                r.aliases
                    .iter()
                    .any(|a| a.contains('*') && glob_matches(a, model))
            })
        };
        let auto = || {
            (model == "auto")
                .then(|| routes.iter().find(|(_, r)| r.steer.is_some()))
                .flatten()
        };
        exact
            .or_else(glob)
            .or_else(auto)
            .or_else(|| routes.iter().find(|(_, r)| r.default))
            .map(|(name, _)| name.clone())
    }

    /// Route `name` as it is now.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Route>> {
        let cell = self.map.get(name)?;
        let g = cell.read().unwrap_or_else(|p| p.into_inner());
        Some(g.clone())
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Every route as it is now (no order: see `AppState::route_order`).
    pub(crate) fn values(&self) -> std::vec::IntoIter<Arc<Route>> {
        let v: Vec<Arc<Route>> = self.map.keys().filter_map(|k| self.get(k)).collect();
        v.into_iter()
    }

    /// Every route with its name.
    pub(crate) fn iter(&self) -> std::vec::IntoIter<(String, Arc<Route>)> {
        let v: Vec<(String, Arc<Route>)> = self
            .map
            .keys()
            .filter_map(|k| Some((k.clone(), self.get(k)?)))
            .collect();
        v.into_iter()
    }

    /// Puts `route` in force for its name; returns the one it replaced (`None`: no such route).
    pub(crate) fn swap(&self, route: Arc<Route>) -> Option<Arc<Route>> {
        let cell = self.map.get(&route.name)?;
        let mut g = cell.write().unwrap_or_else(|p| p.into_inner());
        Some(std::mem::replace(&mut *g, route))
    }
}

/// Whether `name` matches `pattern`, whose `*` stand for any run of characters (case-sensitive, as model
/// names are).
pub(crate) fn glob_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = (parts[0], &parts[1..]);
    let Some(mut left) = name.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for p in middle {
        match left.find(p) {
            Some(at) => left = &left[at + p.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_match_model_names() {
        assert!(glob_matches("claude-*", "claude-haiku-4-5-20251001"));
        assert!(glob_matches("gpt-5*", "gpt-5"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("a*b*c", "a-x-b-y-c"));
        assert!(glob_matches("exact", "exact"));
        assert!(!glob_matches("exact", "exact2"));
        assert!(!glob_matches("claude-*", "gpt-5"));
        assert!(!glob_matches("a*bc", "abc-no"));
        assert!(!glob_matches("ab*ba", "aba"));
    }
}
