//! The config resolved once, after validation: every `[[llm]]` entry merged over `[reranker]` (the only place
//! that section is read), every route with its head, its prompts and its cascade of stages by backend index,
//! grade presets applied, the implicit `classify` route built when none is configured. Everything downstream
//! (the engine, the offline tools) reads a [`Resolved`], never `[reranker]` or the raw route tables.

use crate::{
    Config, ConfigError, HeadConfig, OutOfScopeConfig, Prefer, PromptConfig, RerankerConfig,
    RouteConfig, RouteKind, RoutingConfig, StageConfig,
};

/// One LLM backend: its name and its fields (its own over `[reranker]`'s).
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub name: String,
    pub config: RerankerConfig,
}

/// One stage of a route's cascade.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Its name in the route (`stages[].name`, by default its first backend's): its policy's key.
    pub name: String,
    /// Its alternatives, by index into [`Resolved::backends`], the first first.
    pub alternatives: Vec<usize>,
    /// How to choose among its alternatives and how often to retry one (its grade's presets applied).
    pub prefer: Prefer,
    pub retries: u32,
    /// It is gone on to when the previous stage's fused ambiguity is above this (0 on the first stage: the
    /// routing policy decides that escalation).
    pub theta: f64,
    /// Its own policy (stages after the first).
    pub policy: Option<RoutingConfig>,
}

impl Stage {
    /// Its first backend's index.
    pub fn first(&self) -> usize {
        self.alternatives[0]
    }
}

/// One route.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    pub kind: RouteKind,
    /// Its head (its own, else `[prefilter]`'s).
    pub head: HeadConfig,
    /// Its prompt templates (its own, else `[reranker.prompts]`).
    pub prompts: PromptConfig,
    /// Its cascade (at least one stage: the first backend by default).
    pub stages: Vec<Stage>,
    pub out_of_scope: Option<OutOfScopeConfig>,
    /// A request's budget when it asks for none, and the largest it may ask for (milliseconds).
    pub deadline_ms: Option<u64>,
    pub max_deadline_ms: u64,
    /// Its written answers and generations at temperature 0 may be cached.
    pub cache_generations: bool,
}

/// The config as every reader takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The backends in force, in order (the first is the default).
    pub backends: Vec<Backend>,
    /// The routes in config order (one `classify` route when the config names none).
    pub routes: Vec<Route>,
}

impl Resolved {
    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// The first classify route: what the offline tools (`eval --hybrid`, `fit-fusion`) evaluate.
    pub fn classify_route(&self) -> Option<&Route> {
        self.routes.iter().find(|r| r.kind == RouteKind::Classify)
    }

    /// The backend of a route's first stage (its judge: how candidates are shown, how many are reranked).
    pub fn judge(&self, route: &Route) -> &RerankerConfig {
        &self.backends[route.stages[0].first()].config
    }

    /// The judge and prompts the offline tools use: the first classify route's, else the first backend's
    /// with `[reranker.prompts]`.
    pub fn offline_judge(&self) -> (&Backend, &PromptConfig) {
        match self.classify_route() {
            Some(r) => (&self.backends[r.stages[0].first()], &r.prompts),
            None => (&self.backends[0], &self.routes[0].prompts),
        }
    }
}

impl Config {
    /// Checks the sections it resolves and resolves them ([`Resolved`]): the one reader of `[reranker]`. The
    /// tenants are not read here (a keys file is read where the tenants are served, and checked by
    /// [`Config::validate`] at load).
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        let backends: Vec<Backend> = self
            .checked_backends()?
            .into_iter()
            .map(|(name, config)| Backend { name, config })
            .collect();
        let implicit = [RouteConfig {
            name: "classify".into(),
            kind: RouteKind::Classify,
            head: None,
            prompts: None,
            out_of_scope: None,
            deadline_ms: None,
            max_deadline_ms: None,
            stages: None,
            cache_generations: false,
        }];
        let listed: &[RouteConfig] = if self.routes.is_empty() {
            &implicit
        } else {
            &self.routes
        };
        let routes = listed
            .iter()
            .map(|r| self.route(r, &backends))
            .collect::<Result<_, _>>()?;
        Ok(Resolved { backends, routes })
    }

    fn route(&self, r: &RouteConfig, backends: &[Backend]) -> Result<Route, ConfigError> {
        let default = [StageConfig::Name(backends[0].name.clone())];
        let stages = r
            .stages
            .as_deref()
            .unwrap_or(&default)
            .iter()
            .enumerate()
            .map(|(k, st)| {
                let alternatives = st
                    .backends()
                    .iter()
                    .map(|n| {
                        backends.iter().position(|b| b.name == *n).ok_or_else(|| {
                            ConfigError::invalid(
                                format!("routes.{}.stages[{k}]", r.name),
                                format!("`{n}` is no LLM backend"),
                            )
                        })
                    })
                    .collect::<Result<Vec<usize>, _>>()?;
                Ok(Stage {
                    name: st.name().to_string(),
                    alternatives,
                    prefer: st.prefer(),
                    retries: st.retries(),
                    theta: st.theta().unwrap_or(0.0),
                    policy: (k > 0).then(|| st.policy(&self.routing)),
                })
            })
            .collect::<Result<Vec<Stage>, ConfigError>>()?;
        Ok(Route {
            name: r.name.clone(),
            kind: r.kind,
            head: r
                .head
                .clone()
                .unwrap_or_else(|| self.prefilter.head.clone()),
            prompts: r
                .prompts
                .clone()
                .unwrap_or_else(|| self.reranker.prompts.clone()),
            stages,
            out_of_scope: r.out_of_scope.clone(),
            deadline_ms: r.deadline_ms,
            max_deadline_ms: r.max_deadline_ms_in_force(),
            cache_generations: r.cache_generations,
        })
    }
}
