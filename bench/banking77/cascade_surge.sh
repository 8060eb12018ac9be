#!/usr/bin/env bash
# Issue 24's surge: the real server with the three-tier cascade (Tier-0 → Qwen2.5-Coder-0.5B → 1.5B, one local
# worker each, the head of bench/banking77/cascade.sh with both fits) and the brownout ladder on; the open-loop
# bench at a base rate, then at 3× it, each for DURATION, on our test split's rows. Per phase: each channel's
# P50 / P99 and band, LLM answers by stage, degraded answers by reason.
#
# usage: bench/banking77/cascade_surge.sh THETA1 THETA2 [RATE] [DURATION]   (θ of the first and second stage)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
theta1="$1" theta2="$2" rate="${3:-2}" duration="${4:-60s}"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
b=/tmp/b77
out=$b/surge
mkdir -p $out
python3 - <<'PY'
import csv, json
with open("/tmp/b77/test.csv") as f, open("/tmp/b77/surge/test.jsonl", "w") as o:
    for r in csv.DictReader(f):
        o.write(json.dumps({"text": r["text"], "label": r["category"]}) + "\n")
PY
small=models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
big=models/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"$bin/tiergate" serve --listen 127.0.0.1:18280 --admin-listen 127.0.0.1:18281 \
  --set "prefilter.head={ kind = \"trained\", dir = \"$b/head-cascade\" }" \
  --set "llm=[{ name = \"small\", model = \"$small\", workers = 1 }, { name = \"big\", model = \"$big\", workers = 1 }]" \
  --set "routes=[{ name = \"classify\", kind = \"classify\", stages = [\"small\", { llm = \"big\", theta = $theta2 }] }]" \
  --set 'routing.mode="static"' --set "routing.theta_base=$theta1" --set "routing.theta_min=$theta1" \
  --set 'brownout={ enabled = true, hold_ms = 2000, cool_ms = 10000, p95_limit_ms = 6000 }' >$out/serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  if curl -sf localhost:18281/admin/console | python3 -c 'import json,sys; b=json.load(sys.stdin)["backends"]; sys.exit(0 if all(x["live_workers"] for x in b) else 1)' 2>/dev/null; then break; fi
  sleep 1
done
for phase in base surge; do
  r=$rate
  [[ $phase == surge ]] && r=$(python3 -c "print($rate * 3)")
  "$bin/tiergate-bench" --url http://127.0.0.1:18280 --admin-url http://127.0.0.1:18281 --data $out/test.jsonl \
    --route classify --rate "$r" --poisson --duration "$duration" --json $out/$phase.json | tee $out/$phase.txt
done
