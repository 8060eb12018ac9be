//! Tenancy: who may use the API, with which routes, weights and budgets ([`tenants`]), and the tenant list
//! kept in step across replicas ([`sync`]).

pub(crate) mod tenants;

use std::sync::{Arc, RwLock};

/// The tenancy part of the state.
pub(crate) struct Tenancy {
    /// Who may use the public API (`[[tenants]]` and `tenants_file`; empty: open); swapped whole on a reload.
    tenants: RwLock<Arc<tenants::Tenants>>,
    /// What each tenant got since start (the console).
    pub figures: Arc<tenants::Figures>,
}

impl Tenancy {
    /// The configured tenants, nothing counted yet.
    pub(crate) fn new(all: &[tiergate_config::TenantConfig]) -> Self {
        Self {
            tenants: RwLock::new(Arc::new(tenants::Tenants::new(all))),
            figures: Arc::default(),
        }
    }

    /// The tenants in force.
    pub(crate) fn in_force(&self) -> Arc<tenants::Tenants> {
        self.tenants
            .read()
            .map_or_else(|p| p.into_inner().clone(), |t| t.clone())
    }

    /// Puts `next` in force.
    pub(crate) fn swap(&self, next: Arc<tenants::Tenants>) {
        if let Ok(mut t) = self.tenants.write() {
            *t = next;
        }
    }
}

/// Who is calling with the API key `key`: its tenant, admitted at its request rate (`Unauthorized` without a
/// known key, `RateLimited` over its rate), or `None` when no tenants are configured (the API is open).
pub(crate) fn identify(
    tenants: &tenants::Tenants,
    key: Option<&str>,
    now: std::time::Instant,
) -> Result<Option<Arc<tenants::Tenant>>, crate::error::EngineError> {
    use crate::error::EngineError;
    if tenants.is_empty() {
        return Ok(None);
    }
    let key = key.filter(|k| !k.is_empty()).ok_or_else(|| {
        EngineError::Unauthorized(
            "this server needs an API key: `Authorization: Bearer <key>` or `x-api-key: <key>`"
                .into(),
        )
    })?;
    let tenant = tenants.lookup(key).ok_or_else(|| {
        EngineError::Unauthorized("the API key is not known to this server".into())
    })?;
    tenant.admit(now).map_err(|wait| EngineError::RateLimited {
        message: format!(
            "tenant `{}` is over its request rate: retry after the Retry-After seconds",
            tenant.id.0
        ),
        retry_after_s: crate::error::retry_after(wait),
    })?;
    Ok(Some(tenant.clone()))
}
