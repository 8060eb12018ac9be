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
    /// How Tier-0 steers a generate route between its stages.
    pub steer: Option<Steer>,
    /// Earlier user turns Tier-0 reads, and at most how many characters of them.
    pub context_turns: usize,
    pub context_chars: usize,
    /// Other model names it answers to (exact names and `*` globs), and whether it answers unknown names.
    pub aliases: Vec<String>,
    pub default: bool,
    /// The most tokens one request may generate.
    pub max_tokens: u32,
    /// The most characters of conversation text one request may carry.
    pub max_text_chars: usize,
}

/// A steered generate route's map, its stages by index.
#[derive(Debug, Clone, PartialEq)]
pub struct Steer {
    /// Label → stage index.
    pub by_label: Vec<(String, usize)>,
    /// The stage of unsure requests and unmapped labels.
    pub default: usize,
    /// Its θ policy (a static `theta` unless the route sets one): a sure label's ambiguity is at most its θ_eff.
    pub policy: RoutingConfig,
    /// Label → what its generations are written with.
    pub overrides: Vec<(String, crate::SteerOverride)>,
    /// A session's switch budget, percent of its spend.
    pub max_switch_spend_pct: f64,
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
            steer: None,
            context_turns: 0,
            context_chars: 400,
            aliases: Vec::new(),
            default: false,
            max_tokens: None,
            max_text_chars: None,
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
        if r.context_turns > 0 && r.kind == RouteKind::Generate && r.steer.is_none() {
            return Err(ConfigError::invalid(
                format!("routes.{}.context_turns", r.name),
                "a generate route has no Tier-0 unless it is steered: there is nothing to read context",
            ));
        }
        if r.context_turns > 0 && r.context_chars == 0 {
            return Err(ConfigError::invalid(
                format!("routes.{}.context_chars", r.name),
                "must be at least 1 when context_turns is set",
            ));
        }
        let steer = r
            .steer
            .as_ref()
            .map(|s| steer_of(r, s, &stages, &self.routing))
            .transpose()?;
        Ok(Route {
            steer,
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
            context_turns: r.context_turns,
            context_chars: r.context_chars,
            aliases: r.aliases.clone(),
            default: r.default,
            max_tokens: r.max_tokens_in_force(),
            max_text_chars: r.max_text_chars_in_force(),
        })
    }
}

/// Route `r`'s steering with its stage names resolved: only a generate route is steered, by a θ in [0, 1],
/// to stages it has.
fn steer_of(
    r: &RouteConfig,
    s: &crate::SteerConfig,
    stages: &[Stage],
    global: &RoutingConfig,
) -> Result<Steer, ConfigError> {
    let at = format!("routes.{}.steer", r.name);
    if r.kind != RouteKind::Generate {
        return Err(ConfigError::invalid(
            at,
            "only a generate route is steered (classify and answer routes escalate instead)",
        ));
    }
    if !(0.0..=1.0).contains(&s.theta) {
        return Err(ConfigError::invalid(
            format!("{at}.theta"),
            "must be in [0, 1]",
        ));
    }
    let index = |name: &str| {
        stages.iter().position(|st| st.name == name).ok_or_else(|| {
            let names: Vec<&str> = stages.iter().map(|st| st.name.as_str()).collect();
            ConfigError::invalid(
                format!("{at}.by_label"),
                format!("`{name}` is no stage of the route ({})", names.join(", ")),
            )
        })
    };
    let mut by_label = Vec::new();
    let mut default = stages.len() - 1;
    for (label, stage) in &s.by_label {
        if label == "*" {
            default = index(stage)?;
        } else {
            by_label.push((label.clone(), index(stage)?));
        }
    }
    let policy = s.policy(global);
    policy.validate_stage(&format!("{at}.policy"))?;
    for (label, o) in &s.overrides {
        let bad =
            |f: &str, why: &str| ConfigError::invalid(format!("{at}.overrides.{label}.{f}"), why);
        if o.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(bad("temperature", "must be in [0, 2]"));
        }
        if o.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(bad("top_p", "must be in (0, 1]"));
        }
        if o.max_tokens == Some(0) {
            return Err(bad("max_tokens", "must be at least 1"));
        }
    }
    if !(s.max_switch_spend_pct.is_finite() && s.max_switch_spend_pct >= 0.0) {
        return Err(ConfigError::invalid(
            format!("{at}.max_switch_spend_pct"),
            "must be a percentage at least 0",
        ));
    }
    Ok(Steer {
        by_label,
        default,
        policy,
        overrides: s.overrides.clone().into_iter().collect(),
        max_switch_spend_pct: s.max_switch_spend_pct,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

    use super::*;
    use crate::{EngineKind, Prefer};

    /// A config from TOML over every key's default, with a checkpoint head (valid without labels).
    fn config(text: &str) -> Config {
        let mut c: Config = toml::from_str(text).unwrap();
        if c.prefilter.head == HeadConfig::default() {
            c.prefilter.head = HeadConfig::Checkpoint;
        }
        c
    }

    fn invalid_field(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid { field, .. } => field,
            other => panic!("not a field error: {other}"),
        }
    }

    #[test]
    fn reranker_alone_is_the_default_backend_and_no_routes_is_one_classify_route() {
        let c = config("[reranker]\nworkers = 3\ncandidates = 4\n");
        let r = c.resolve().unwrap();
        assert_eq!(r.backends.len(), 1);
        assert_eq!(r.backends[0].name, crate::DEFAULT_BACKEND);
        assert_eq!(r.backends[0].config, c.reranker);
        assert_eq!(r.routes.len(), 1);
        let route = &r.routes[0];
        assert_eq!(
            (route.name.as_str(), route.kind),
            ("classify", RouteKind::Classify)
        );
        assert_eq!(route.head, HeadConfig::Checkpoint);
        assert_eq!(route.prompts, c.reranker.prompts);
        assert_eq!(route.stages.len(), 1);
        assert_eq!(route.stages[0].alternatives, [0]);
        assert_eq!(route.stages[0].theta, 0.0);
        assert!(
            route.stages[0].policy.is_none(),
            "the first stage follows [routing]"
        );
        assert_eq!(r.route("classify").map(|x| &x.name), Some(&route.name));
        assert!(r.route("answer").is_none());
        assert_eq!(
            r.classify_route().map(|x| x.name.as_str()),
            Some("classify")
        );
    }

    #[test]
    fn llm_entries_are_merged_over_reranker_and_stages_name_them_by_index() {
        let c = config(
            r#"
            [reranker]
            workers = 2
            engine = "stub"
            rerank_deadline_ms = 1234

            [[llm]]
            name = "small"

            [[llm]]
            name = "big"
            workers = 5
            rerank_deadline_ms = 9000

            [[routes]]
            name = "classify"
            kind = "classify"
            stages = ["small", { any = ["big", "small"], prefer = "latency", theta = 0.4 }]

            [[routes]]
            name = "gen"
            kind = "generate"
            stages = ["big"]
            head = { kind = "checkpoint" }
            "#,
        );
        let r = c.resolve().unwrap();
        let names: Vec<&str> = r.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["small", "big"]);
        // `[reranker]` is every entry's base; an entry's own field wins.
        assert_eq!(r.backends[0].config.workers, 2);
        assert_eq!(r.backends[0].config.rerank_deadline_ms, 1234);
        assert_eq!(r.backends[0].config.engine, EngineKind::Stub);
        assert_eq!(r.backends[1].config.workers, 5);
        assert_eq!(r.backends[1].config.rerank_deadline_ms, 9000);
        assert_eq!(r.backends[1].config.engine, EngineKind::Stub);

        let classify = r.route("classify").unwrap();
        assert_eq!(classify.stages.len(), 2);
        assert_eq!(classify.stages[0].alternatives, [0]);
        assert_eq!(classify.stages[0].name, "small");
        assert_eq!(classify.stages[1].alternatives, [1, 0]);
        assert_eq!(classify.stages[1].prefer, Prefer::Latency);
        assert_eq!(classify.stages[1].theta, 0.4);
        assert_eq!(classify.stages[1].first(), 1);
        let policy = classify.stages[1].policy.as_ref().unwrap();
        assert_eq!(
            policy.theta_base, 0.4,
            "a later stage's policy is a static θ = theta"
        );
        assert_eq!(r.judge(classify), &r.backends[0].config);
        assert_eq!(r.offline_judge().0.name, "small");
        let generate = r.route("gen").unwrap();
        assert_eq!(generate.stages[0].alternatives, [1]);
        assert_eq!(generate.head, HeadConfig::Checkpoint);
    }

    #[test]
    fn a_route_keeps_its_own_head_and_prompts_over_the_shared_ones() {
        let mut c = config("[[routes]]\nname = \"a\"\nkind = \"answer\"\n[[routes]]\nname = \"b\"\nkind = \"classify\"\n");
        let mut own = c.reranker.prompts.clone();
        own.answer_system = format!("Route a's own. {}", own.answer_system);
        c.routes[0].prompts = Some(own.clone());
        c.routes[0].head = Some(HeadConfig::Trained(crate::TrainedHeadConfig {
            dir: "heads/a".into(),
        }));
        let r = c.resolve().unwrap();
        assert_eq!(r.routes[0].prompts, own);
        assert!(
            matches!(&r.routes[0].head, HeadConfig::Trained(t) if t.dir == std::path::Path::new("heads/a"))
        );
        assert_eq!(r.routes[1].prompts, c.reranker.prompts);
        assert_eq!(r.routes[1].head, HeadConfig::Checkpoint);
        // Without a classify route the offline tools take the first backend and the first route's prompts.
        c.routes[1].kind = RouteKind::Generate;
        let r = c.resolve().unwrap();
        assert!(r.classify_route().is_none());
        assert_eq!(r.offline_judge().1, &own);
    }

    #[test]
    fn resolve_refuses_what_it_cannot_resolve_naming_the_field() {
        for (text, field) in [
            (
                "[[llm]]\nname = \"a\"\n[[llm]]\nname = \"a\"\n",
                "llm[1].name",
            ),
            (
                "[[llm]]\nname = \"a\"\n[[routes]]\nname = \"classify\"\nkind = \"classify\"\nstages = [\"nope\"]\n",
                "routes[0].stages[0]",
            ),
            (
                "[[routes]]\nname = \"x\"\nkind = \"classify\"\nstages = []\n",
                "routes[0].stages",
            ),
            (
                "[[routes]]\nname = \"x\"\nkind = \"classify\"\n[[routes]]\nname = \"x\"\nkind = \"answer\"\n",
                "routes[1].name",
            ),
            ("[cache]\ntau = 0.0\n", "cache.tau"),
            ("[heads]\nshadow_requests = 0\n", "heads.shadow_requests"),
            ("[feedback]\nwindow_s = 0\n", "feedback.window_s"),
        ] {
            let e = config(text).resolve().unwrap_err();
            assert_eq!(invalid_field(e), field, "{text}");
        }
    }

    #[test]
    fn steer_is_for_generate_routes_and_their_own_stages() {
        let with = |kind: &str, steer: &str| {
            config(&format!(
                "[[routes]]\nname = \"r\"\nkind = \"{kind}\"\nsteer = {steer}\n"
            ))
            .resolve()
        };
        let ok = with(
            "generate",
            r#"{ by_label = { a = "default" }, theta = 0.3 }"#,
        )
        .unwrap();
        let s = ok.routes[0].steer.as_ref().unwrap();
        assert_eq!(
            (s.by_label.clone(), s.default, s.policy.theta_base),
            (vec![("a".to_string(), 0)], 0, 0.3)
        );
        assert_eq!(s.policy.mode, crate::RoutingMode::Static);
        let own = with(
            "generate",
            r#"{ by_label = { a = "default" }, policy = { mode = "load", theta_base = 0.2, k = 0.5 }, overrides = { a = { system = "Be brief.", max_tokens = 64 } } }"#,
        )
        .unwrap();
        let s = own.routes[0].steer.as_ref().unwrap();
        assert_eq!((s.policy.mode, s.policy.k), (crate::RoutingMode::Load, 0.5));
        assert_eq!(s.overrides[0].1.max_tokens, Some(64));
        for (kind, steer, field) in [
            (
                "classify",
                r#"{ by_label = { a = "default" } }"#,
                "routes.r.steer",
            ),
            (
                "generate",
                r#"{ by_label = { a = "nope" } }"#,
                "routes.r.steer.by_label",
            ),
            (
                "generate",
                r#"{ by_label = { a = "default" }, theta = 2.0 }"#,
                "routes.r.steer.theta",
            ),
            (
                "generate",
                r#"{ by_label = { a = "default" }, policy = { mode = "risk", max_error = 0.1 } }"#,
                "routes.r.steer.policy.max_error",
            ),
            (
                "generate",
                r#"{ by_label = { a = "default" }, overrides = { a = { temperature = 3.0 } } }"#,
                "routes.r.steer.overrides.a.temperature",
            ),
        ] {
            assert_eq!(
                invalid_field(with(kind, steer).unwrap_err()),
                field,
                "{steer}"
            );
        }
    }
}
