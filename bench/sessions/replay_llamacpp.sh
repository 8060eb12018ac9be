#!/usr/bin/env bash
# Issue 47's session demonstration on real llama.cpp servers: two llama-cpp-python servers with SmolLM2-135M
# (one thread each, prompt cache on: `--cache true`), the two alternatives of one stage chosen by latency; ten-
# turn sessions replayed (bench/sessions/replay.py, streamed) with session pins on and off. Prints the
# switch share and the median time to first token by turn: from turn 2 on, a pinned session's server holds its
# conversation's prefix, an unpinned one may not.
#
# usage: bench/sessions/replay_llamacpp.sh [SESSIONS] [TURNS] [CONCURRENCY]   (defaults 40 10 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
n="${1:-40}" turns="${2:-10}" conc="${3:-2}"
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
for pins in true false; do
  pids=()
  for port in 18511 18512; do
    python3 -m llama_cpp.server --host 127.0.0.1 --port $port --model $model --n_ctx 2048 --n_threads 1 \
      --cache true --verbose false >/tmp/llama-$port.log 2>&1 &
    pids+=($!)
  done
  for port in 18511 18512; do
    for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 1; done
  done
  "$bin" serve --listen 127.0.0.1:18513 --admin-listen 127.0.0.1:18514 \
    --set 'llm=[{ name = "a", engine = "openai", url = "http://127.0.0.1:18511/v1", model = "smollm2", workers = 1, max_concurrent = 1, generate_prior_ms = 300 }, { name = "b", engine = "openai", url = "http://127.0.0.1:18512/v1", model = "smollm2", workers = 1, max_concurrent = 1, generate_prior_ms = 300 }]' \
    --set 'routes=[{ name = "chat", kind = "generate", stages = [{ name = "s", any = ["a", "b"], prefer = "latency" }] }]' \
    --set "sessions.enabled=$pins" >/tmp/replay-llama-serve.log 2>&1 &
  pids+=($!)
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18513/ready >/dev/null && break; sleep 1; done
  echo -n "pins $pins: "
  python3 bench/sessions/replay.py http://127.0.0.1:18513 chat "$n" "$turns" "$conc"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
