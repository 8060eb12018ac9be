//! Tenancy: who may use the API, with which routes, weights and budgets ([`tenants`]), and the tenant list
//! kept in step across replicas ([`sync`]).

pub mod sync;
pub mod tenants;

use std::sync::{Arc, RwLock};

/// The tenancy part of the state.
pub struct Tenancy {
    /// Who may use the public API (`[[tenants]]` and `tenants_file`; empty: open); swapped whole on a reload.
    tenants: RwLock<Arc<tenants::Tenants>>,
    /// What each tenant got since start (the console).
    pub figures: Arc<tenants::Figures>,
}

impl Tenancy {
    /// The configured tenants, nothing counted yet.
    pub fn new(all: &[tiergate_config::TenantConfig]) -> Self {
        Self {
            tenants: RwLock::new(Arc::new(tenants::Tenants::new(all))),
            figures: Arc::default(),
        }
    }

    /// The tenants in force.
    pub fn in_force(&self) -> Arc<tenants::Tenants> {
        self.tenants
            .read()
            .map_or_else(|p| p.into_inner().clone(), |t| t.clone())
    }

    /// Puts `next` in force.
    pub fn swap(&self, next: Arc<tenants::Tenants>) {
        if let Ok(mut t) = self.tenants.write() {
            *t = next;
        }
    }
}
