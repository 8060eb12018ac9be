#!/usr/bin/env bash
# Issue 47's session demonstration on the stub engine: 1,000 replayed ten-turn sessions over a generate route
# whose one stage has two alternatives chosen by latency (`prefer = "latency"`), once with session pins
# (`[sessions] enabled`, the default) and once without; prints the share of later turns that switched
# backend. The stub's two backends are alike (20 ms per generation), so the latency choice flips between
# them as their recent P95s move.
#
# usage: bench/sessions/replay_stub.sh [SESSIONS] [TURNS] [CONCURRENCY]   (defaults 1000 10 16)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
n="${1:-1000}" turns="${2:-10}" conc="${3:-16}"
for pins in true false; do
  "$bin" serve --listen 127.0.0.1:18495 --admin-listen 127.0.0.1:18496 \
    --set 'llm=[{ name = "a", engine = "stub", workers = 1, extra_args = ["--stub-delay-ms", "20"] }, { name = "b", engine = "stub", workers = 1, extra_args = ["--stub-delay-ms", "20"] }]' \
    --set 'routes=[{ name = "chat", kind = "generate", stages = [{ name = "s", any = ["a", "b"], prefer = "latency" }] }]' \
    --set "sessions.enabled=$pins" >/tmp/replay-serve.log 2>&1 &
  server=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18495/ready >/dev/null && break; sleep 1; done
  echo -n "pins $pins: "
  python3 bench/sessions/replay.py http://127.0.0.1:18495 chat "$n" "$turns" "$conc"
  kill $server; wait $server 2>/dev/null || true
done
