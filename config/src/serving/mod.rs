//! The sections `tiergate serve` reads, one file each: `[server]` ([`server`]), `[routing]` ([`routing`]),
//! `[utilization]` ([`utilization`]), `[policy_store]` ([`policy_store`]), `[brownout]` ([`brownout`]),
//! `[reranker]` and each `[[llm]]` ([`reranker`]), and the `[[routes]]` list ([`routes`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{ConfigError, HeadConfig, PromptConfig};

mod brownout;
mod policy_store;
mod reranker;
mod routes;
mod routing;
mod server;
mod utilization;

pub use brownout::*;
pub use policy_store::*;
pub use reranker::*;
pub use routes::*;
pub use routing::*;
pub use server::*;
pub use utilization::*;

#[cfg(test)]
mod tests {
    use super::{RerankerConfig, RoutingConfig, RoutingMode, ServerConfig};

    #[test]
    fn the_error_bound_is_checked_and_kept_to_the_routing_policy() {
        let with = |f: &dyn Fn(&mut RoutingConfig)| {
            let mut c = RoutingConfig::default();
            f(&mut c);
            c
        };
        let err = |c: RoutingConfig| c.validate("routing").unwrap_err().to_string();
        assert!(err(with(&|c| c.mode = RoutingMode::Risk)).contains("routing.max_error"));
        assert!(err(with(&|c| c.max_error = Some(0.0))).contains("routing.max_error"));
        assert!(err(with(&|c| c.max_error = Some(1.0))).contains("routing.max_error"));
        assert!(err(with(&|c| c.confidence = 1.0)).contains("routing.confidence"));
        assert!(err(with(&|c| c.audit_rate = 1.5)).contains("routing.audit_rate"));
        let risk = with(&|c| {
            c.mode = RoutingMode::Risk;
            c.max_error = Some(0.05);
        });
        assert!(risk.validate("routing").is_ok());
        // A later stage's policy may not carry them.
        assert!(risk.validate_stage("stage").is_err());
        assert!(with(&|c| c.audit_rate = 0.1)
            .validate_stage("stage")
            .is_err());
        assert!(RoutingConfig::default().validate_stage("stage").is_ok());
    }

    #[test]
    fn server_and_reranker_sections_refuse_zero_and_unsafe_values() {
        assert!(ServerConfig::default().validate("server").is_ok());
        let bad = |f: &dyn Fn(&mut ServerConfig)| {
            let mut c = ServerConfig::default();
            f(&mut c);
            c.validate("server").unwrap_err().to_string()
        };
        assert!(bad(&|c| c.max_in_flight = 0).contains("server.max_in_flight"));
        assert!(bad(&|c| c.header_timeout_ms = 0).contains("server.header_timeout_ms"));
        assert!(bad(&|c| c.body_timeout_ms = 0).contains("server.body_timeout_ms"));
        assert!(bad(&|c| c.max_connections = 0).contains("server.max_connections"));
        assert!(bad(&|c| c.admin_token = Some(String::new())).contains("server.admin_token"));
        assert!(bad(&|c| c.admin_token = Some("   x   ".into())).contains("server.admin_token"));
        assert!(bad(&|c| c.admin_listen = c.listen).contains("server.admin_listen"));
        assert!(bad(&|c| c.max_connections_per_peer = c.max_connections + 1)
            .contains("max_connections_per_peer"));
        let mut r = RerankerConfig {
            heartbeat_timeout_ms: 0,
            ..RerankerConfig::default()
        };
        assert!(r
            .validate("reranker")
            .unwrap_err()
            .to_string()
            .contains("heartbeat_timeout_ms"));
        r.heartbeat_timeout_ms = 5_000;
        r.rerank_deadline_ms = 0;
        assert!(r
            .validate("reranker")
            .unwrap_err()
            .to_string()
            .contains("rerank_deadline_ms"));
    }

    #[test]
    fn header_override_is_off_by_default() {
        assert!(!RoutingConfig::default().allow_header_override);
    }

    #[test]
    fn a_routing_patch_refuses_unknown_fields_and_wrong_types_and_a_put_needs_them_all() {
        use crate::RoutingPatch;
        use serde_json::json;
        let fields = RoutingConfig::fields();
        assert!(
            fields.len() >= 16 && fields.iter().any(|f| f == "max_error"),
            "{fields:?}"
        );
        let e = RoutingPatch::parse(json!({"theta_bsae": 0.3})).unwrap_err();
        assert!(e.to_string().contains("unknown field `theta_bsae`"), "{e}");
        let e = RoutingPatch::parse(json!({"theta_base": "high"})).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        assert!(RoutingPatch::parse(json!([1])).is_err());
        let p = RoutingPatch::parse(json!({"theta_base": 0.3, "mode": "static"})).unwrap();
        assert!(p
            .missing()
            .is_some_and(|f| f != "mode" && f != "theta_base"));
        let base = RoutingConfig::default();
        let c = p.apply(&base).unwrap();
        assert_eq!(
            (c.theta_base, c.mode, c.k),
            (0.3, RoutingMode::Static, base.k)
        );
        // Out of range: refused when applied.
        let p = RoutingPatch::parse(json!({"theta_base": 7.0})).unwrap();
        assert!(p
            .apply(&base)
            .unwrap_err()
            .to_string()
            .contains("theta_base"));
        // Every field set: nothing missing, and the policy comes back as it was.
        let all = RoutingPatch::parse(serde_json::to_value(&base).unwrap()).unwrap();
        assert_eq!(all.missing(), None);
        assert_eq!(
            all.apply(&RoutingConfig {
                theta_base: 0.1,
                ..base.clone()
            })
            .unwrap(),
            base
        );
    }
}
