#!/usr/bin/env bash
# Two builds of tiergate side by side, runs alternating on the same machine: the `tier0_http` example (the
# real server in-process, Tier-0 only) and `tiergate-bench` against `tiergate serve` at θ = 1 with the stub
# engine (every request answered by Tier-0 through the whole HTTP path). Prints each run and the median p50
# and p99 of each side with its run-to-run spread.
#
#   bench/paired.sh BEFORE_DIR AFTER_DIR [RUNS]
#
# Each DIR holds `tier0_http`, `tiergate`, `tiergate-reranker` and `tiergate-bench` (copy them out of
# target/debug/ and target/debug/examples/ after building each commit). Run from the repository root (the
# default config reads models/); time it only on a quiet machine.
set -euo pipefail
before="$1" after="$2" runs="${3:-5}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
workload="bench/workloads/bank24.jsonl"
port=18480
serve_and_bench() { # DIR SIDE RUN
  local dir="$1" side="$2" i="$3"
  "$dir/tiergate" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
    --set 'reranker.engine="stub"' --set 'routing.mode="static"' --set routing.theta_base=1.0 \
    >"$out/serve.$side.$i.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$dir/tiergate-bench" --url "http://127.0.0.1:$port" --data "$workload" --concurrency 16 \
    --duration 15s --json "$out/bench.$side.$i.json" >/dev/null
  kill -TERM "$pid"
  wait "$pid" || true
}
for i in $(seq 1 "$runs"); do
  for side in before after; do
    dir="${!side}"
    "$dir/tier0_http" 600 >"$out/tier0_http.$side.$i.txt" 2>/dev/null
    serve_and_bench "$dir" "$side" "$i"
    echo "run $i $side: $(grep -h 'one at a time' "$out/tier0_http.$side.$i.txt")"
  done
done
python3 - "$out" "$runs" <<'PY'
import json, re, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def tier0_http(side, i):
    t = open(f"{out}/tier0_http.{side}.{i}.txt").read()
    m = re.search(r"HTTP p50 ([\d.]+) ms \(p99 ([\d.]+) ms\)", t)
    c = re.search(r"32 clients:\s+(\d+) req/s, p50\s+([\d.]+) ms, p99\s+([\d.]+) ms", t)
    return {"one-at-a-time p50": float(m[1]), "one-at-a-time p99": float(m[2]),
            "32 clients p50": float(c[2]), "32 clients p99": float(c[3]), "32 clients req/s": float(c[1])}
def bench(side, i):
    r = json.load(open(f"{out}/bench.{side}.{i}.json"))
    r = r["runs"][0] if "runs" in r else r
    ch = next(c for c in r["channels"] if c["channel"] == "tier0")
    return {"bench p50": ch["latency"]["p50_ms"], "bench p99": ch["latency"]["p99_ms"],
            "bench req/s": ch["requests_per_s"]}
rows = {s: [dict(tier0_http(s, i), **bench(s, i)) for i in range(1, runs + 1)] for s in ("before", "after")}
print(f"{'figure':<22} {'before median (spread)':>26} {'after median (spread)':>26} {'change':>8}")
for k in rows["before"][0]:
    b = [r[k] for r in rows["before"]]; a = [r[k] for r in rows["after"]]
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"{k:<22} {mb:>12.2f} ({min(b):.2f}–{max(b):.2f}) {ma:>12.2f} ({min(a):.2f}–{max(a):.2f}) {100 * (ma - mb) / mb:>+7.1f}%")
print(f"runs: {out}")
PY
