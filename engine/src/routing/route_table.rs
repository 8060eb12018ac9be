//! The routes by name, each swappable whole: a request takes its route once ([`RouteTable::get`], an `Arc`)
//! and keeps it to the end, so a head promoted meanwhile (a live head swap) is never half seen.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::routing::route::Route;

/// Routes by name.
pub struct RouteTable {
    map: HashMap<String, RwLock<Arc<Route>>>,
}

impl RouteTable {
    pub fn new(routes: HashMap<String, Route>) -> Self {
        Self {
            map: routes
                .into_iter()
                .map(|(k, r)| (k, RwLock::new(Arc::new(r))))
                .collect(),
        }
    }

    /// Route `name` as it is now.
    pub fn get(&self, name: &str) -> Option<Arc<Route>> {
        let cell = self.map.get(name)?;
        let g = cell.read().unwrap_or_else(|p| p.into_inner());
        Some(g.clone())
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Every route as it is now (no order: see `AppState::route_order`).
    pub fn values(&self) -> std::vec::IntoIter<Arc<Route>> {
        let v: Vec<Arc<Route>> = self.map.keys().filter_map(|k| self.get(k)).collect();
        v.into_iter()
    }

    /// Every route with its name.
    pub fn iter(&self) -> std::vec::IntoIter<(String, Arc<Route>)> {
        let v: Vec<(String, Arc<Route>)> = self
            .map
            .keys()
            .filter_map(|k| Some((k.clone(), self.get(k)?)))
            .collect();
        v.into_iter()
    }

    /// Puts `route` in force for its name; returns the one it replaced (`None`: no such route).
    pub fn swap(&self, route: Arc<Route>) -> Option<Arc<Route>> {
        let cell = self.map.get(&route.name)?;
        let mut g = cell.write().unwrap_or_else(|p| p.into_inner());
        Some(std::mem::replace(&mut *g, route))
    }
}
