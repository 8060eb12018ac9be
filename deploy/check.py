#!/usr/bin/env python3
"""Checks the rendered Kubernetes manifests (`kubectl kustomize deploy/k8s | python3 deploy/check.py`):
schema validation (kubernetes-validate, strict: unknown fields are errors; CRDs such as ServiceMonitor are
reported as unchecked), and tiergate's own rules: the grace period covers the lame duck and the drain, the
probes hit /ready and /health, /dev/shm is a RAM-backed emptyDir, the admin listener is not exposed.
Prints the tiergate container's TIERGATE__* environment as JSON (the Rust test loads it as configuration,
so a misspelt key fails there). Exit status 1 on any problem."""

import json
import sys
import tomllib

import yaml
import kubernetes_validate

DEFAULTS = "config/default.toml"


def main():
    docs = [d for d in yaml.safe_load_all(sys.stdin.read()) if d]
    problems, unchecked = [], []
    for d in docs:
        kind, name = d.get("kind"), d.get("metadata", {}).get("name")
        try:
            kubernetes_validate.validate(d, "1.30.0", strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unchecked.append(f"{kind}/{name}")
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{kind}/{name}: {e.message}")
    deploy = next((d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "tiergate"), None)
    if deploy is None:
        problems.append("no tiergate Deployment")
        env = {}
    else:
        pod = deploy["spec"]["template"]["spec"]
        c = next(c for c in pod["containers"] if c["name"] == "tiergate")
        server = tomllib.load(open(DEFAULTS, "rb")).get("server", {})
        # The serde defaults when default.toml leaves them out (config/src/serving.rs).
        lame = server.get("lame_duck_ms", 2000)
        drain = server.get("drain_ms", 10000)
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 < lame + drain + 5000:
            problems.append(f"terminationGracePeriodSeconds {grace} < lame duck {lame} ms + drain {drain} ms + 5 s")
        if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready":
            problems.append("readinessProbe must be GET /ready")
        if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
            problems.append("livenessProbe must be GET /health")
        shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        if not shm or vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") != "Memory":
            problems.append("/dev/shm must be an emptyDir with medium: Memory (the queue segment)")
        args = " ".join(c.get("args", []))
        if "--admin-listen 127.0.0.1:" not in args:
            problems.append("the admin listener must stay on loopback (--admin-listen 127.0.0.1:PORT)")
        if any(p.get("containerPort") == 8081 for p in c.get("ports", [])):
            problems.append("the admin port must not be a container port")
        env = {e["name"]: e["value"] for e in c.get("env", []) if e["name"].startswith("TIERGATE__")}
    for u in unchecked:
        print(f"check: no schema for {u} (custom resource): not validated", file=sys.stderr)
    for p in problems:
        print(f"check: {p}", file=sys.stderr)
    print(json.dumps({"resources": len(docs), "unchecked": unchecked, "env": env}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
