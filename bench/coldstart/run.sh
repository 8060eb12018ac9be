#!/usr/bin/env bash
# A newcomer's first hour, timed: a fresh clone of REV with an empty cargo home and an empty target directory,
# then the README's serve command (`scripts/tiergate`), polled until the first `classify` answer and `/ready`.
# Writes OUT/times.txt (seconds from the clone) and the cargo `--timings` reports (OUT/clone/target-timings).
#
# usage: bench/coldstart/run.sh [REV] [OUT] [PORT]     (defaults HEAD /tmp/coldstart 18080)
# Run it on a quiet machine: nothing else building. It downloads every crate (and the models, unless pip's
# cache holds their wheels) like a fresh machine would.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rev="${1:-HEAD}" out="${2:-/tmp/coldstart}" port="${3:-18080}"
# Every cargo build the serve script runs writes a `--timings` report.
export TIERGATE_CARGO_FLAGS="--timings"
# An empty pip cache too: the model wheels download as on a fresh machine.
source "$root/bench/coldstart/fresh.sh"
scripts/tiergate serve --set "server.listen=\"127.0.0.1:$port\"" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; pkill -f "$out/target/debug/tiergate" 2>/dev/null || true' EXIT
answered="" ready=""
while [[ -z $ready ]]; do
  kill -0 $server 2>/dev/null || { echo "coldstart: the serve script exited" >&2; tail -20 "$out/serve.log" >&2; exit 1; }
  if [[ -z $answered ]] && curl -sf -m 5 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d '{"model":"classify","messages":[{"role":"user","content":"I lost my card"}]}' >"$out/first_answer.json" 2>/dev/null; then
    answered=1; mark "first classify answer"
  fi
  if curl -sf -m 5 "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then ready=1; mark "/ready"; fi
  sleep 1
done
