#!/usr/bin/env bash
# The live run of the error bound on Banking77: the head risk.sh trains, served under `mode = "risk"` (ε = 5%,
# 95%) with half of Tier-0's lone answers audited and the stub LLM; a real Prometheus scrapes the server with
# deploy/prometheus/rules.yml loaded; tiergate-bench replays split.py's test rows at 20 requests/s, posts
# feedback on a fifth of the answers, labels the pending audits with the rows' gold labels every 2 s, and from
# request 1,500 on cuts each query to a random half of its words (the drift). At the end: the bench's report
# (the silent error and θ as the run went), the alerts Prometheus has firing or pending, and a screenshot of
# the console (headless Chromium).
#
# usage: bench/banking77/drift.sh [OUT_DIR]   (needs /tmp/b77/head-risk from risk.sh and /tmp/b77/test.csv
#        from split.py; prometheus and chromium from Debian). Environment: REQUESTS (4000), DRIFT_AT (1500),
#        RATE (20).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
b=/tmp/b77
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
work="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
[[ -f $b/head-risk/calibration.json && -f $b/test.csv ]] || { echo "drift: run split.py and risk.sh first" >&2; exit 1; }

"$bin/tiergate" serve --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 \
  --set "prefilter.head={kind=\"trained\", dir=\"$b/head-risk\"}" \
  --set 'routing.mode="risk"' --set routing.max_error=0.05 --set routing.confidence=0.95 \
  --set routing.audit_rate=0.5 --set 'reranker.engine="stub"' \
  --set "feedback.path=\"$work/feedback.sqlite\"" --set feedback.audit_llm=true > "$work/serve.log" 2>&1 &
pids+=($!)
cat > "$work/prometheus.yml" <<YML
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ["$root/deploy/prometheus/rules.yml"]
scrape_configs:
  - job_name: tiergate
    static_configs: [{targets: ["127.0.0.1:18480"]}]
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address=127.0.0.1:18490 > "$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
  curl -sf http://127.0.0.1:18480/ready >/dev/null && curl -sf http://127.0.0.1:18490/-/ready >/dev/null && break
  sleep 0.2
done

"$bin/tiergate-bench" --url http://127.0.0.1:18480 --admin-url http://127.0.0.1:18481 --route classify \
  --data $b/test.csv --rate "${RATE:-20}" --requests "${REQUESTS:-4000}" --drift-at "${DRIFT_AT:-1500}" \
  --feedback 0.2 --label-audits --seed 31 --json "$out/drift.json" --quiet | tee "$out/drift.txt"

sleep 10  # one more rule evaluation on the last scrape
echo "alerts (Prometheus, deploy/prometheus/rules.yml):"
curl -s http://127.0.0.1:18490/api/v1/alerts > "$work/alerts.json"
python3 - "$work/alerts.json" <<'PY' | tee -a "$out/drift.txt"
import json, sys
for a in json.load(open(sys.argv[1]))["data"]["alerts"]:
    l = a["labels"]
    print("  %s %s %s since %s" % (l["alertname"], l.get("route", ""), a["state"], a["activeAt"]))
PY
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,2200 \
  --virtual-time-budget=4000 --screenshot="$out/console.png" http://127.0.0.1:18481/console >/dev/null 2>&1
echo "drift: report, alerts and console.png in $out"
