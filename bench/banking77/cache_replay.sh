#!/usr/bin/env bash
# Tier −1 on Banking77 (issue 34): split.py's test rows replayed through `tiergate serve` with a Zipf
# repetition profile (`tiergate-bench --zipf S`: the r-th row of a seeded shuffle drawn ∝ r^-S), θ fixed, the
# JUDGE reranking escalations; once with the answer cache off and once on (in memory, the default τ — chosen on
# the dev rows with `tiergate eval --cache`, docs/cache.md). Same seed, so both runs ask the same requests in
# the same order. Reports per channel (tiergate-bench), and the LLM jobs from the server's metrics.
#
# usage: bench/banking77/cache_replay.sh [S] [REQUESTS] [THETA] [JUDGE] [LOAD]  (defaults 1.0 1500 0.25 qwen0.5 4)
# LOAD: N closed-loop clients, or R/s for an open loop of R requests a second (Poisson arrivals): the fair
# comparison of a channel's latency, since a closed loop sends faster when the cache answers.
# HEAD: the Tier-0 head (default /tmp/b77/head-risk, risk.sh's head trained on split.py's train rows).
# The rerank deadline is 60 s, as in loop.sh (the channel judge's first escalations build its label prefixes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
s="${1:-1.0}" n="${2:-1500}" theta="${3:-0.25}" judge="${4:-qwen0.5}" load="${5:-4}"
case "$load" in
  */s) loadargs=(--rate "${load%/s}" --poisson) tag="rate${load%/s}" ;;
  *) loadargs=(--concurrency "$load") tag="" ;;
esac
case "$judge" in
  qwen0.5) model="models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
  qwen1.5) model="models/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
  *) echo "unknown judge $judge" >&2; exit 2 ;;
esac
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
b=/tmp/b77
head="${HEAD:-$b/head-risk}"
d=$b/cache-s$s-n$n-$judge${tag:+-$tag}
mkdir -p "$d"
serve() { # CACHE(true|false)
  "$bin/tiergate" serve --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 \
    --set "prefilter.head={ kind = \"trained\", dir = \"$head\" }" --set "reranker.model=\"$model\"" \
    --set 'routing.mode="static"' --set "routing.theta_base=$theta" --set reranker.rerank_deadline_ms=60000 \
    --set "cache.enabled=$1" >"$d/serve-$1.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf localhost:18480/ready >/dev/null 2>&1 && break
    sleep 1
  done
}
stop() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap stop EXIT
for cache in false true; do
  echo "== cache $cache $(date -u +%T)"
  serve "$cache"
  "$bin/tiergate-bench" --url http://127.0.0.1:18480 --admin-url http://127.0.0.1:18481 --data "$b/test.csv" \
    --zipf "$s" --requests "$n" "${loadargs[@]}" --seed 7 --timeout 120s --quiet \
    --json "$d/bench-$cache.json" | tee "$d/bench-$cache.txt"
  curl -sf localhost:18480/metrics | grep -E '^tiergate_(cache_lookups_total|requests_total|rerank_seconds_count)' \
    >"$d/metrics-$cache.txt" || true
  stop
done
python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
for cache in ("false", "true"):
    lines = open(f"{d}/metrics-{cache}.txt").read().splitlines()
    jobs = sum(float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("tiergate_rerank_seconds_count"))
    looks = {}
    for l in lines:
        if l.startswith("tiergate_cache_lookups_total"):
            res = l.split('result="')[1].split('"')[0]
            looks[res] = looks.get(res, 0) + float(l.rsplit(" ", 1)[1])
    print(f"cache={cache}: LLM rerank jobs {jobs:.0f}; cache lookups {looks}")
PY
