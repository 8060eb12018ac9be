#!/usr/bin/env bash
# The paired generation benchmark (docs/benchmarks.md, "The LLM tier on llama.cpp"): tiergate's `generate` route
# on its llama.cpp engine, llama-cpp-python's server (the peer, `n_threads` = the machine's cores) and, for the
# short cells only, tiergate on mistralrs, all on the same GGUF file, in one run (bench/llm/engines.py measures).
#   bench/llm/engines.sh [MODEL.gguf] [engines.py options…]
# Default model: SmolLM2-135M Q4_1. MISTRALRS=0 leaves mistralrs out. Needs scripts/test.sh run once (models,
# llama-cpp-python, the binaries). Both engines are built by cargo with the same flags: llama.cpp's CMake build
# with GGML_NATIVE (-march=native) for tiergate's, pip's build of llama-cpp-python (also GGML_NATIVE by default).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${CARGO_TARGET_DIR:-$HOME/.cache/tiergate/target}/debug"
model="${1:-$root/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
shift || true
threads="$(nproc)"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
ctx="${CONTEXT_TOKENS:-20480}"
echo "engines: logs in $out; model $(basename "$model"); $threads threads" >&2

python3 -m llama_cpp.server --model "$model" --n_ctx "$ctx" --n_threads "$threads" --n_threads_batch "$threads" \
  --host 127.0.0.1 --port 18190 > "$out/llama.log" 2>&1 &
pids=($!)
serve() { # name, port, engine
  "$bin/tiergate" serve --listen "127.0.0.1:$2" --admin-listen "127.0.0.1:$(($2 + 1))" \
    --set "reranker.engine=\"$3\"" --set "reranker.model=\"$model\"" --set reranker.max_concurrent=17 \
    --set "reranker.context_tokens=$ctx" --set reranker.generate_deadline_ms=1800000 \
    --set reranker.warmup_ms=0 --set "feedback.path=\"$out/$1.sqlite\"" > "$out/$1.out" 2> "$out/$1.log" &
  pids+=($!)
}
serve llamacpp 18180 llamacpp
[ "${MISTRALRS:-1}" = 1 ] && serve mistralrs 18182 mistralrs
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
# Waits for URL while PID lives (a server that failed to start, e.g. on a port in use, ends the wait).
up() { for _ in $(seq 900); do curl -sf "$1" >/dev/null && return 0; kill -0 "$2" 2>/dev/null || return 1; sleep 1; done; return 1; }
up http://127.0.0.1:18190/v1/models "${pids[0]}" || { echo "llama-cpp-python did not start: $out/llama.log" >&2; exit 1; }
up http://127.0.0.1:18180/ready "${pids[1]}" || { echo "tiergate (llamacpp) not ready: $out/llamacpp.log" >&2; exit 1; }
skips=()
targets=(--target "tiergate-llamacpp=http://127.0.0.1:18180/v1=generate"
  --target "llama-cpp-python=http://127.0.0.1:18190/v1=peer")
if [ "${MISTRALRS:-1}" = 1 ]; then
  up http://127.0.0.1:18182/ready "${pids[2]}" || { echo "tiergate (mistralrs) not ready: $out/mistralrs.log" >&2; exit 1; }
  targets+=(--target "tiergate-mistralrs=http://127.0.0.1:18182/v1=generate")
  # mistralrs would take hours in the long cells (~6 prompt tokens/s on the 0.5B model).
  skips=(--skip "tiergate-mistralrs:4000:*" --skip "tiergate-mistralrs:20000:*" --skip "tiergate-mistralrs:130:16")
fi
# llama-cpp-python's server runs one request at a time (concurrent ones came back empty here): single streams only.
skips+=(--skip "llama-cpp-python:*:4" --skip "llama-cpp-python:*:16")
python3 "$root/bench/llm/engines.py" "${targets[@]}" "${skips[@]}" "$@"
