//! The Kubernetes manifests (`deploy/k8s`), checked with real tools: `kubectl kustomize` renders them (a YAML
//! or kustomization error fails), `deploy/check.py` validates every resource against the Kubernetes schemas
//! (kubernetes-validate, strict) and tiergate's own rules, and the tiergate container's `TIERGATE__*`
//! environment must load as a valid configuration (a misspelt key or a bad value fails here, not in a pod).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::io::Write;
use std::process::{Command, Stdio};

use tiergate_tests::root;

#[test]
fn manifests_render_validate_and_configure_tiergate() {
    let rendered = Command::new("kubectl")
        .current_dir(root())
        .args(["kustomize", "deploy/k8s"])
        .output()
        .expect("kubectl");
    assert!(
        rendered.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let mut check = Command::new("python3")
        .current_dir(root())
        .arg("deploy/check.py")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(&rendered.stdout)
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "deploy/check.py (pip install kubernetes-validate):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["resources"], 8, "{report}");
    assert_eq!(
        report["unchecked"],
        serde_json::json!(["ServiceMonitor/tiergate"])
    );
    let env: Vec<(String, String)> = report["env"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    assert!(env.len() >= 5, "{env:?}");
    let cfg = tiergate_config::load(None, env, &[])
        .expect("the manifest's environment is a valid config");
    assert_eq!(cfg.reranker.engine, tiergate_config::EngineKind::Openai);
    assert_eq!(cfg.policy_store.kind, tiergate_config::StoreKind::Redis);
    assert_eq!(
        cfg.routing.utilization_source,
        tiergate_config::UtilizationSource::Prometheus
    );
    assert_eq!(
        cfg.utilization.prometheus_query,
        "sum(vllm:num_requests_running)/64"
    );
}
