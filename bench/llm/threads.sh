#!/usr/bin/env bash
# Tier-0 and a rerank beside the LLM's generations (docs/benchmarks.md, "Threads beside Tier-0"): for each
# llama.cpp thread count given, `tiergate serve` on the embedded default (Tier-0 in the server, the worker's
# llama.cpp engine for generations and its scorer for reranks), then `tiergate-bench` on the classify route at
# RATE requests/s for DURATION, first alone, then while GENERATIONS streamed generations (up to 256 tokens each,
# started again as each ends) run on the generate route. Prints Tier-0's and the escalated (rerank) channel's
# latency and the generations' decode rate per cell.
#   bench/llm/threads.sh [THREADS[:BATCH_THREADS]…]   (default: 2 1; RATE=10 DURATION=60s GENERATIONS=4)
# THREADS is `reranker.threads` (decode), BATCH_THREADS `reranker.batch_threads` (prompt chunks; as THREADS when
# not given).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${CARGO_TARGET_DIR:-$HOME/.cache/tiergate/target}/debug"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
rate="${RATE:-10}" duration="${DURATION:-60s}" gens="${GENERATIONS:-4}"
[ $# -gt 0 ] || set -- 2 1
echo "threads: logs in $out; rate $rate/s for $duration; $gens generations" >&2
cd "$root"
up() { for _ in $(seq 600); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
cell() { # threads[:batch_threads], generations
  local t="$1" g="$2" port=18280 name="t${1/:/-}-g$2"
  local decode="${t%%:*}" batch="${t#*:}"
  [ "$batch" = "$t" ] && batch="$decode"
  "$bin/tiergate" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
    --set "reranker.threads=$decode" --set "reranker.batch_threads=$batch" \
    --set "feedback.path=\"$out/$name.sqlite\"" > "$out/$name.out" 2> "$out/$name.log" &
  local server=$!
  up "http://127.0.0.1:$port/ready" || { echo "not ready: $out/$name.log" >&2; kill $server; return 1; }
  local load=()
  for _ in $(seq "$g"); do
    python3 - "$port" > /dev/null 2>> "$out/$name.gen" <<'PY' &
import json, sys, time, urllib.request
port = sys.argv[1]
body = json.dumps({"model": "generate", "max_tokens": 256, "temperature": 0.7, "stream": True,
                   "messages": [{"role": "user", "content": "Write a long story about a bank clerk."}]}).encode()
while True:
    t0 = time.monotonic(); first = last = None; n = 0
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                if b'"content"' in raw:
                    now = time.monotonic(); first = first or now; last = now; n += 1
    except Exception as e:  # noqa: BLE001
        print(f"error {e}", file=sys.stderr); time.sleep(1); continue
    if first and last > first:
        print(f"decode {(n - 1) / (last - first):.2f}", file=sys.stderr, flush=True)
PY
    load+=($!)
  done
  [ "$g" -gt 0 ] && sleep 5
  "$bin/tiergate-bench" --url "http://127.0.0.1:$port" --admin-url "http://127.0.0.1:$((port + 1))" \
    --data bench/workloads/bank24.jsonl --route classify --rate "$rate" --duration "$duration" --quiet \
    --json "$out/$name.json" > "$out/$name.txt" 2>&1
  [ ${#load[@]} -gt 0 ] && kill "${load[@]}" 2>/dev/null
  kill $server; wait $server 2>/dev/null
  python3 - "$out/$name.json" "$out/$name.gen" "$t" "$g" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))["runs"][0]
ch = {c["channel"]: c for c in r["channels"]}
def lat(c):
    l = ch[c].get("latency")
    return f"{ch[c]['count']} · p50 {l['p50_ms']:.1f} / p99 {l['p99_ms']:.1f} ms" if l else "–"
try:
    d = [float(l.split()[1]) for l in open(sys.argv[2]) if l.startswith("decode")]
except FileNotFoundError:
    d = []
dec = f"{statistics.median(d):.1f} tok/s ({len(d)} done)" if d else "–"
print(f"| {sys.argv[3]} | {sys.argv[4]} | {lat('tier0')} | {lat('escalated')} | {ch['errors']['count']} | {dec} |")
PY
}
echo "| threads (decode:prompt) | generations | Tier-0: n · p50 / p99 | escalated (rerank): n · p50 / p99 | errors | generation decode p50 |"
echo "|---|---|---|---|---|---|"
for t in "$@"; do
  cell "$t" 0
  cell "$t" "$gens"
done
