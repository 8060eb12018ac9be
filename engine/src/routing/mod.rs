//! Routing: what a route is ([`route`]: its head, prompts and cascade of stages; [`route_table`]: the routes
//! by name, swapped whole), the θ policy ([`policy`]) and the shared store that carries it across replicas
//! ([`store`]), the error bound ([`risk`]), live head swaps ([`heads`], [`head_swap`]), latency experiments
//! ([`experiments`]), session pins ([`sessions`]) and how a stage's LLM scores are fused with the distribution so far ([`fusion`]).

pub(crate) mod experiments;
pub(crate) mod fusion;
pub(crate) mod heads;
pub(crate) mod policy;
pub(crate) mod risk;
pub(crate) mod route;
pub(crate) mod route_table;
pub(crate) mod sessions;
pub(crate) mod store;

use std::sync::Arc;

/// The routing part of the state.
pub(crate) struct Routing {
    /// Routes by name.
    pub routes: route_table::RouteTable,
    /// The config as resolved at start (backends and routes): what a candidate head's route is built from.
    pub resolved: tiergate_config::Resolved,
    /// Live head swaps: shadows, the heads they replaced, what happened.
    pub heads: heads::Heads,
    /// Route names in config order.
    pub route_order: Vec<String>,
    /// The routing policy.
    pub policy: Arc<policy::Policy>,
    /// The shared policy store, when `[policy_store] kind = "redis"`.
    pub store: Option<Arc<store::RedisStore>>,
    /// Latency-injection experiments in force.
    pub experiments: experiments::Experiments,
    /// Session pins (`[sessions]`).
    pub sessions: sessions::Sessions,
}

impl Routing {
    /// The routes as they are now, in config order.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = Arc<route::Route>> + '_ {
        self.route_order.iter().filter_map(|n| self.routes.get(n))
    }

    /// The classified routes (those with a Tier-0 head) as they are now, in config order.
    pub(crate) fn classified(&self) -> impl Iterator<Item = Arc<route::Route>> + '_ {
        self.in_order().filter(|r| r.prefilter.is_some())
    }
}
