#!/usr/bin/env bash
# Issue 61's replay of priced switching on two real llama.cpp servers (llama-cpp-python's server, one thread
# each, prompt cache on in RAM, sized for about six conversation states): a steered generate route whose
# `small` stage is SmolLM2-135M and `big` stage Qwen2.5-Coder-0.5B, the embedded head's labels split by
# bench/steer/map.toml. The horizon (`sessions.switch_horizon_turns`) is fitted on the dev sessions (the mean
# run of turns a move to another stage serves); the three arms replay the test sessions, each against freshly
# started servers (no arm inherits another's cache):
#   unpinned — `[sessions] enabled = false`: every turn goes where Tier-0 steers it;
#   stay     — pin forever: a session keeps the stage of its first turn;
#   priced   — the priced rule (saving over the horizon against reading the conversation again, within the
#              switch budget).
# Prints one report line per arm (bench/sessions/priced.py report). ENGINE=llamacpp runs the same arms on
# tiergate's own llama.cpp engine instead (the two models in its workers, one thread each, six cached
# sequences each; the prompt tokens read are the engine's own count, from each answer's usage).
#
# usage: bench/sessions/priced.sh [SESSIONS] [TURNS] [CONCURRENCY] [ARMS]   (defaults 24 6 2 "unpinned stay priced";
#        needs scripts/fetch-models.sh --judge qwen2.5-0.5b and llama-cpp-python[server])
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
n="${1:-24}" turns="${2:-6}" conc="${3:-2}" arms="${4:-unpinned stay priced}"
out="${OUT:-/tmp/tiergate-priced}"
mkdir -p "$out"
py=bench/sessions/priced.py
python3 $py sessions dev "$n" "$turns" 1 >"$out/dev.jsonl"
python3 $py sessions test "$n" "$turns" 2 >"$out/test.jsonl"
h=$(python3 $py horizon bench/steer/map.toml "$out/dev.jsonl")
horizon=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['horizon_turns'])" "$h")
echo "dev: $h"
map=$(python3 bench/inline_map.py bench/steer/map.toml)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
engine="${ENGINE:-openai}"
for arm in $arms; do
  pids=()
  if [ "$engine" = llamacpp ]; then
    common="engine = \"llamacpp\", workers = 1, max_concurrent = 1, threads = 1, batch_threads = 1, context_tokens = 12288, cached_sequences = 6, warmup_ms = 0, max_in_flight = 16, generate_deadline_ms = 1800000"
    llm="llm=[{ name = \"small\", model = \"$root/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf\", $common }, { name = \"big\", model = \"$root/models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf\", $common }]"
    logs=()
  else
  # SmolLM2 keeps ~23 KB of state a token, Qwen2.5-0.5B ~12 KB: ~6 states of ~1,600 tokens each.
  for spec in "18611 models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf 220000000" \
              "18612 models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 115000000"; do
    set -- $spec
    python3 -m llama_cpp.server --host 127.0.0.1 --port "$1" --model "$2" --n_ctx 4096 --n_threads 1 \
      --cache true --cache_type ram --cache_size "$3" --interrupt_requests false --verbose true \
      >"$out/$arm-$1.log" 2>&1 &
    pids+=($!)
  done
  for port in 18611 18612; do
    for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 1; done
  done
  llm='llm=[{ name = "small", engine = "openai", url = "http://127.0.0.1:18611/v1", model = "smollm2", workers = 1, max_concurrent = 1, max_in_flight = 16, prompt_cache_sessions = 6, generate_deadline_ms = 1800000, request_timeout_ms = 1800000, first_byte_timeout_ms = 600000, chunk_timeout_ms = 600000 }, { name = "big", engine = "openai", url = "http://127.0.0.1:18612/v1", model = "qwen", workers = 1, max_concurrent = 1, max_in_flight = 16, prompt_cache_sessions = 6, generate_deadline_ms = 1800000, request_timeout_ms = 1800000, first_byte_timeout_ms = 600000, chunk_timeout_ms = 600000 }]'
  logs=("$out/$arm-18611.log" "$out/$arm-18612.log")
  fi
  case $arm in
    unpinned) sessions='--set sessions.enabled=false' ;;
    stay) sessions='--set sessions.switch="stay"' ;;
    priced) sessions="--set sessions.switch=\"priced\" --set sessions.switch_horizon_turns=$horizon" ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  "$bin" serve --listen 127.0.0.1:18613 --admin-listen 127.0.0.1:18614 \
    --set "$llm" \
    --set "routes=[{ name = \"chat\", kind = \"generate\", stages = [\"small\", \"big\"], deadline_ms = 300000, max_deadline_ms = 300000, steer = { by_label = $map, theta = 0.5 } }]" \
    --set server.stream_head_ms=600000 $sessions >"$out/$arm-serve.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do curl -sf http://127.0.0.1:18613/ready >/dev/null && break; sleep 1; done
  # Every backend's worker live (/ready needs one backend of the route).
  for _ in $(seq 1 300); do
    curl -s http://127.0.0.1:18614/admin/console | python3 -c "import json,sys; sys.exit(0 if all(b.get('live_workers', 0) >= 1 for b in json.load(sys.stdin)['backends']) else 1)" 2>/dev/null && break
    sleep 1
  done
  start=$(date +%s)
  python3 $py run http://127.0.0.1:18613 chat "$out/test.jsonl" "$conc" >"$out/$arm-turns.jsonl"
  echo -n "$arm ($(( $(date +%s) - start )) s): "
  python3 $py report bench/steer/map.toml "$out/$arm-turns.jsonl" "${logs[@]}"
  curl -s http://127.0.0.1:18614/admin/console | python3 -c "import json,sys; print(json.dumps([{k: b.get(k) for k in ('name','prefill_ms_per_token','cold_prefill_ms_per_token','decode_ms_per_token','completion_tokens')} for b in json.load(sys.stdin)['backends']]))" || true
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
