#!/usr/bin/env bash
# Claude Code and Codex CLI through tiergate on a real model, by hand (docs/llm.md, "Agents on a real model"):
# Qwen2.5-Coder-0.5B (Q4_K_M) behind a real llama.cpp server (llama-cpp-python, --n_ctx 32768, its
# chatml-function-calling format parses the model's calls), tiergate's `generate` route on it through the
# `openai` engine with `tools = true`, the agent CLIs that scripts/test.sh installs, one question about a file
# holding a secret word. Prints each client's wall time, exit status and answer, and whether the word came back.
# Needs: scripts/test.sh run once (models, llama-cpp-python, the CLIs, the binaries). Several minutes on 2 cores.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${CARGO_TARGET_DIR:-$HOME/.cache/tiergate/target}/debug"
agents="${TIERGATE_AGENTS_DIR:-$HOME/.cache/tiergate/agents}/node_modules/.bin"
model="$root/models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
out="${OUT:-$(mktemp -d)}"
llama_port="${LLAMA_PORT:-18090}" port="${PORT:-18080}" admin="${ADMIN_PORT:-18081}"
echo "real_model: logs in $out" >&2

python3 -m llama_cpp.server --model "$model" --n_ctx 32768 --n_threads 2 --chat_format chatml-function-calling \
  --host 127.0.0.1 --port "$llama_port" > "$out/llama.log" 2>&1 &
llama=$!
RUST_LOG=info,tiergate::access=debug "$bin/tiergate" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
  --set "llm=[{ name = \"qwen\", engine = \"openai\", url = \"http://127.0.0.1:$llama_port/v1\", model = \"qwen\", tools = true, workers = 1, request_timeout_ms = 1800000 }]" \
  --set 'routes=[{ name = "classify", kind = "classify" }, { name = "generate", kind = "generate", stages = ["qwen"], aliases = ["claude-*", "gpt-*"], default = true }]' \
  --set reranker.generate_deadline_ms=1800000 --set "feedback.path=\"$out/ledger.sqlite\"" \
  > "$out/tiergate.out" 2> "$out/tiergate.log" &
server=$!
trap 'kill $server $llama 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 600); do
  curl -sf "127.0.0.1:$llama_port/v1/models" >/dev/null && curl -sf "127.0.0.1:$port/ready" >/dev/null && break
  sleep 1
done

word="walrus$RANDOM$RANDOM"
work="$out/work"; mkdir -p "$work" "$out/home" "$out/codex"
echo "The secret word is $word." > "$work/notes.txt"
question="What is the secret word in notes.txt?"

report() { # name, status, seconds, output file
  local found=no
  grep -q "$word" "$4" && found=yes
  echo "$1: exit $2 in $3 s; the word came back: $found; answer: $(tail -c 400 "$4" | tr '\n' ' ')"
}

t=$SECONDS
(cd "$work" && HOME="$out/home" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-local \
  DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 1800 "$agents/claude" -p "$question" --model generate --allowedTools Read > "$out/claude.out" 2>&1)
report "claude-code" $? $((SECONDS - t)) "$out/claude.out"

cat > "$out/codex/config.toml" <<TOML
model = "generate"
model_provider = "tiergate"
check_for_update_on_startup = false
[analytics]
enabled = false
[model_providers.tiergate]
name = "tiergate"
base_url = "http://127.0.0.1:$port/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 1800000
TOML
t=$SECONDS
(cd "$work" && HOME="$out/home" CODEX_HOME="$out/codex" timeout 1800 "$agents/codex" exec --skip-git-repo-check \
  --dangerously-bypass-approvals-and-sandbox "$question" > "$out/codex.out" 2>&1)
report "codex" $? $((SECONDS - t)) "$out/codex.out"
echo "requests answered, by path and status (the server's access log):"
grep "request done" "$out/tiergate.log" | sed -E 's/.*otel.name=([A-Z]+ [^ ]+).*status=([0-9]+).*/\1 \2/' | sort | uniq -c
grep -E " WARN | ERROR " "$out/tiergate.log" | tail -10
