#!/usr/bin/env bash
# Paired speed check of two builds (e.g. before and after a profile change): `tiergate serve` (embedded
# default: SmolLM2-135M) of each build directory, with the worker next to it, started in turn, ROUNDS times
# alternately, and measures generation tokens/s (3 generations of 64 tokens at temperature 0,
# timed end to end) and the rerank's service time (20 classify requests at θ = 0, so each escalates; the
# server's `rerank` Server-Timing). Run on a quiet machine.
#
# usage: bench/coldstart/worker_speed.sh BIN_DIR_A BIN_DIR_B [ROUNDS]   (each holding tiergate, tiergate-reranker)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
a="$1" b="$2" rounds="${3:-3}" port=18480
measure() { # BIN_DIR LABEL
  "$1/tiergate" serve --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
    --set 'routing.mode="static"' --set 'routing.theta_base=0.0' >/tmp/worker_speed.log 2>&1 &
  local server=$!
  for _ in $(seq 600); do curl -sf "127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.5; done
  python3 - "$port" "$2" <<'PY'
import json, statistics, sys, time, urllib.request
port, label = sys.argv[1], sys.argv[2]
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        timing = r.headers.get("server-timing", "")
        out = json.load(r)
    return time.perf_counter() - t, timing, out
rates = []
for i in range(3):
    dt, _, out = post({"model": "generate", "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Write a short story about a bank, part {i}."}]})
    rates.append(out["usage"]["completion_tokens"] / dt)
reranks = []
queries = ["I lost my card", "What is the exchange rate for euros?", "How do I change my address?",
           "My transfer has not arrived", "Can I get a loan?", "Why was I charged a fee?"]
for i in range(20):
    _, timing, _ = post({"model": "classify", "messages": [{"role": "user", "content": queries[i % len(queries)]}]})
    for part in timing.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if name == "rerank":
            reranks.append(float(rest))
print(f"{label}: generation {statistics.median(rates):.1f} tokens/s (runs {', '.join(f'{r:.1f}' for r in rates)}); "
      f"rerank p50 {statistics.median(reranks):.0f} ms of {len(reranks)}")
PY
  kill -TERM $server; wait $server 2>/dev/null || true
}
for r in $(seq "$rounds"); do
  measure "$a" "A round $r"
  measure "$b" "B round $r"
done
