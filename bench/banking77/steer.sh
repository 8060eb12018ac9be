#!/usr/bin/env bash
# Issue 47's routing demonstration on Banking77: a steered generate route (`chat`) over two stub stages,
# `small` and `big`, with the committed label→stage map (bench/banking77/steer_map.toml) on a head trained on
# split.py's train rows; θ chosen on dev, routing accuracy reported on test (steer_report.py). The stages are
# stub engines: what is measured is where Tier-0 sends each request, not what the stage writes.
#
# usage: bench/banking77/steer.sh   (needs /tmp/b77/{train,dev,test}.csv from split.py; trains /tmp/b77/head once)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
b=/tmp/b77
[[ -f $b/head/head.json ]] || "$bin" train --encoder models/all-MiniLM-L6-v2 --data $b/train.csv --out $b/head
map=$(python3 bench/inline_map.py bench/banking77/steer_map.toml)
"$bin" serve --listen 127.0.0.1:18490 --admin-listen 127.0.0.1:18491 \
  --set "prefilter.head={ kind = \"trained\", dir = \"$b/head\" }" \
  --set 'llm=[{ name = "small", engine = "stub", workers = 1 }, { name = "big", engine = "stub", workers = 1 }]' \
  --set "routes=[{ name = \"classify\", kind = \"classify\" }, { name = \"chat\", kind = \"generate\", stages = [\"small\", \"big\"], steer = { by_label = $map } }]" \
  --set 'routing.mode="static"' --set routing.theta_base=1.0 >/tmp/b77/steer-serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18490/ready >/dev/null && break; sleep 1; done
python3 bench/banking77/steer_report.py http://127.0.0.1:18490 http://127.0.0.1:18491 \
  bench/banking77/steer_map.toml $b/dev.csv $b/test.csv
