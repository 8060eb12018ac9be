#!/usr/bin/env bash
# Issue 47's load shift: a steered generate route in `load` mode over two real llama.cpp servers
# (llama-cpp-python's server, one thread each): `small` = SmolLM2-135M, `big` = Qwen2.5-Coder-0.5B. The
# embedded few-shot head's labels are split by bench/steer/map.toml; the route's policy is θ = 0.05 + 0.9·u,
# u = the busy fraction of the big stage's workers (real load, no manual value). Two levels of
# bench/workloads/bank24.jsonl traffic: one client with a pause (big mostly idle), then eight clients without
# (big saturated); REQUESTS (300) each.
#
# usage: bench/steer/load_shift.sh [REQUESTS]   (needs scripts/fetch-models.sh --judge qwen2.5-0.5b and
#        llama-cpp-python[server])
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
n="${1:-300}"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for spec in "18501 models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" \
            "18502 models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; do
  set -- $spec
  python3 -m llama_cpp.server --host 127.0.0.1 --port "$1" --model "$2" --n_ctx 1024 --n_threads 1 \
    >/tmp/llama-$1.log 2>&1 &
  pids+=($!)
done
for port in 18501 18502; do
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 1; done
done
map=$(python3 bench/inline_map.py bench/steer/map.toml)
"$bin" serve --listen 127.0.0.1:18503 --admin-listen 127.0.0.1:18504 \
  --set 'llm=[{ name = "small", engine = "openai", url = "http://127.0.0.1:18501/v1", model = "smollm2", workers = 1 }, { name = "big", engine = "openai", url = "http://127.0.0.1:18502/v1", model = "qwen", workers = 1 }]' \
  --set "routes=[{ name = \"chat\", kind = \"generate\", stages = [\"small\", \"big\"], steer = { by_label = $map, policy = { mode = \"load\", theta_base = 0.05, k = 0.9, theta_max = 0.95, utilization_source = \"workers\" } } }]" \
  >/tmp/steer-load-serve.log 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18503/ready >/dev/null && break; sleep 1; done
python3 bench/steer/load_shift.py http://127.0.0.1:18503 http://127.0.0.1:18504 chat \
  bench/workloads/bank24.jsonl "$n" 1:1.2 8:0
