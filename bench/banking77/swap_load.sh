#!/usr/bin/env bash
# A live head swap under load (issue 33): the real server on a head (Tier-0 only: θ = 1, no LLM worker) and 32
# closed-loop clients on the test rows for DURATION, while a second head goes through `POST
# /admin/heads/classify` (200 shadowed requests, checked on the small dev set, the default margins), is
# promoted, rolled back and rolled forward again. The bench reports errors, each channel's latency and band,
# and the answers by the head that classified them (`x-tiergate-head-version`).
#
# usage: bench/banking77/swap_load.sh HEAD_IN_FORCE CANDIDATE HOLDOUT.csv [DURATION]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
h0="$1" h1="$2" holdout="$3" duration="${4:-40s}"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
out=/tmp/b77/swap
mkdir -p $out
python3 - <<'PY'
import csv, json
with open("/tmp/b77/test.csv") as f, open("/tmp/b77/swap/test.jsonl", "w") as o:
    for r in csv.DictReader(f):
        o.write(json.dumps({"text": r["text"], "label": r["category"]}) + "\n")
PY
"$bin/tiergate" serve --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 \
  --set "prefilter.head={ kind = \"trained\", dir = \"$h0\" }" --set reranker.workers=0 \
  --set 'routing.mode="static"' --set routing.theta_base=1.0 --set "feedback.path=\"$out/fb.sqlite\"" \
  >$out/serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf localhost:18480/ready >/dev/null 2>&1 && break; sleep 1; done
(
  sleep 5
  curl -s -X POST localhost:18481/admin/heads/classify -H 'content-type: application/json' \
    -d "{\"dir\": \"$h1\", \"holdout\": \"$holdout\", \"requests\": 200}" >$out/start.json
  for _ in $(seq 300); do
    curl -s localhost:18481/admin/heads | grep -q '"promoted"\|"refused"' && break
    sleep 0.1
  done
  sleep 5
  curl -s -X POST localhost:18481/admin/heads/classify/rollback >$out/rollback1.json
  sleep 5
  curl -s -X POST localhost:18481/admin/heads/classify/rollback >$out/rollback2.json
) &
ops=$!
"$bin/tiergate-bench" --url http://127.0.0.1:18480 --admin-url http://127.0.0.1:18481 --data $out/test.jsonl \
  --route classify --concurrency 32 --duration "$duration" --json $out/bench.json | tee $out/bench.txt
wait $ops || true
curl -s localhost:18481/admin/heads >$out/heads.json
python3 - <<'PY'
import json
h = json.load(open("/tmp/b77/swap/heads.json"))
for e in h["history"]:
    print(e["action"], e["version"], e.get("reason", "")[:300])
PY
