//! The operator's changes and their views: a checked live head swap (shadow, promotion, rollback) and the
//! answer cache's view and clear. Each returns data or an [`EngineError`]; the door adds its auth and status.

use serde_json::{json, Value};

use super::Engine;
use crate::error::EngineError;
use crate::routing::heads::{Holdout, StartError, StartRequest, MAX_SHADOW_REQUESTS};

/// A head swap's refusal, `param` naming the field it is about.
fn refused(e: StartError, param: &'static str) -> EngineError {
    match e {
        StartError::Invalid(m) => EngineError::invalid(param, m),
        StartError::Conflict(m) => EngineError::Conflict(m),
        StartError::Unavailable(m) => EngineError::Unavailable(m),
    }
}

impl Engine {
    /// Each classified route's head, its shadow and whether it can roll back, and the swaps' history.
    pub fn heads(&self) -> Value {
        let state = &*self.state;
        let routes: Vec<Value> = state.routing.classified()
            .map(|r| {
                json!({"route": r.name, "version": r.head_version, "dir": state.routing.heads.dir_of(&r.name),
                    "fusion_source": r.fusion.source, "can_roll_back": state.routing.heads.can_roll_back(&r.name),
                    "shadow": state.routing.heads.shadow_of(&r.name).map(|s| s.view())})
            })
            .collect();
        json!({"object": "list", "data": routes, "history": state.routing.heads.history()})
    }

    /// Puts the head in `req.dir` into shadow beside `route`'s head in force: refused for a folder that is
    /// not a head of this route's labels, `requests` out of 1–[`MAX_SHADOW_REQUESTS`] or a holdout over its
    /// bounds (checked before a row is classified), while another shadow runs or another start loads its head
    /// (refused before this one loads), or when it is the head in force.
    pub async fn shadow_head(&self, route: &str, req: StartRequest) -> Result<Value, EngineError> {
        let state = &self.state;
        let current = state
            .routing
            .routes
            .get(route)
            .ok_or_else(|| EngineError::NotFound(format!("no route `{route}`")))?;
        if current.prefilter.is_none() {
            return Err(EngineError::invalid(
                "route",
                format!("route `{route}` generates: it has no head"),
            ));
        }
        if req
            .requests
            .is_some_and(|n| !(1..=MAX_SHADOW_REQUESTS).contains(&n))
        {
            return Err(EngineError::invalid(
                "requests",
                format!("must be 1–{MAX_SHADOW_REQUESTS}"),
            ));
        }
        if !req.dir.join("head.json").is_file() {
            return Err(EngineError::invalid(
                "dir",
                format!(
                    "{}: no head.json (a `tiergate train` or `distill` folder)",
                    req.dir.display()
                ),
            ));
        }
        let _claim = state
            .routing
            .heads
            .claim(route)
            .map_err(|e| refused(e, "dir"))?;
        let holdout = match req.holdout.clone() {
            Some(h) => Some(
                tokio::task::spawn_blocking(move || Holdout::read(&h))
                    .await
                    .map_err(|e| EngineError::Internal(e.to_string()))?
                    .map_err(|m| EngineError::invalid("holdout", m))?,
            ),
            None => None,
        };
        let (st, name, dir) = (state.clone(), route.to_string(), req.dir.clone());
        let candidate = tokio::task::spawn_blocking(move || st.candidate_route(&name, &dir))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|e| EngineError::invalid("dir", format!("{}: {e:#}", req.dir.display())))?;
        let shadow = state
            .routing
            .heads
            .begin(state, candidate, &req, holdout)
            .map_err(|e| refused(e, "dir"))?;
        let mut body = shadow.view();
        body["object"] = json!("head.shadow");
        body["route"] = json!(route);
        body["in_force"] = json!(current.head_version);
        Ok(body)
    }

    /// Puts back the head the last swap of `route` replaced, here and in the shared record with its folder.
    pub async fn roll_back_head(&self, route: &str) -> Result<Value, EngineError> {
        if !self.state.routing.routes.contains_key(route) {
            return Err(EngineError::NotFound(format!("no route `{route}`")));
        }
        let (version, replaced) = crate::tasks::head_swap::roll_back_shared(&self.state, route)
            .await
            .map_err(|e| refused(e, "route"))?;
        Ok(
            json!({"object": "head.rollback", "route": route, "version": version, "replaced": replaced}),
        )
    }

    /// The answer cache: its settings, size and shared store.
    pub fn cache_view(&self) -> Value {
        let c = &self.state.config.cache;
        let Some(cache) = &self.state.cache else {
            return json!({"enabled": false});
        };
        let (entries, bytes) = cache.size();
        json!({
            "enabled": true, "kind": c.kind, "entries": entries, "bytes": bytes, "max_bytes": c.max_bytes,
            "ttl_s": c.ttl_s, "semantic": c.semantic, "tau": c.tau, "bucket_cap": c.bucket_cap,
            "shared_up": cache.shared_up(), "guards_cover": cache.covers(),
            "shared_removal": cache.removal(),
        })
    }

    /// Clears the answer cache here and in its shared store: what was dropped and where the shared removal
    /// stands, and whether that removal still runs (`NotFound` when the cache is off, `Unavailable` when the
    /// shared store did not answer).
    pub async fn clear_cache(&self) -> Result<(Value, bool), EngineError> {
        let Some(cache) = &self.state.cache else {
            return Err(EngineError::NotFound(
                "the answer cache is off ([cache] enabled = false)".into(),
            ));
        };
        let (here, shared) = cache.clear().await;
        tracing::info!(target: "tiergate::audit", entries = here, shared = ?shared, "answer cache cleared");
        match shared {
            None => Ok((json!({"cleared": here}), false)),
            Some(None) => Err(EngineError::StoreUnavailable(format!(
                "cleared {here} entries here; the shared store did not answer, so its entries stay readable: retry"
            ))),
            Some(Some(c)) => {
                let running = c.removal.state == "running";
                let body = json!({"cleared": here, "shared": {"epoch": c.epoch, "removal": c.removal}});
                Ok((body, running))
            }
        }
    }
}
