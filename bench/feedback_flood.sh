#!/usr/bin/env bash
# Tenant B's chat latency alone and while tenant A floods `POST /v1/feedback` with bogus ids, then feedback on
# unknown against foreign ids side by side — on one `tiergate serve` (stub engine, θ = 1: every chat is a
# Tier-0 answer through the whole HTTP path) with tenants a and b.
#
#   bench/feedback_flood.sh [FLOOD_PER_S] [SECONDS]
#
# BIN is the folder holding `tiergate` and `tiergate-bench` (default: $CARGO_TARGET_DIR/debug or target/debug).
# Run from the repository root on a quiet machine; the flood's client shares the machine with the server.
set -euo pipefail
bin="${BIN:-${CARGO_TARGET_DIR:-target}/debug}"
rate="${1:-300}" secs="${2:-20}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
port=18490
sha() { printf %s "$1" | sha256sum | cut -c1-64; }
tenants="tenants=[{name=\"a\",key_sha256=\"$(sha key-a)\"},{name=\"b\",key_sha256=\"$(sha key-b)\"}]"
"$bin/tiergate" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
  --set 'reranker.engine="stub"' --set 'routing.mode="static"' --set routing.theta_base=1.0 \
  --set "feedback.path=\"$out/feedback.sqlite\"" --set "$tenants" >"$out/serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
url="http://127.0.0.1:$port"
b_chats() { # NAME
  "$bin/tiergate-bench" --url "$url" --api-key key-b --data bench/workloads/bank24.jsonl --rate 50 \
    --duration "${secs}s" --json "$out/$1.json" >/dev/null
  python3 - "$out/$1.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
errors = sum(sum(c["errors"].values()) for c in r["channels"])
for c in r["channels"]:
    if c["count"] and c["channel"] == "all":
        l = c["latency"]
        print(f"tenant b {sys.argv[2]:>6}: {c['count']} {c['channel']} answers, p50 {l['p50_ms']:.2f} ms, "
              f"p99 {l['p99_ms']:.2f} ms, {errors} errors")
PY
}
b_chats alone
python3 bench/feedback_flood.py flood --url "$url" --key key-a --rate "$rate" --seconds "$((secs + 4))" \
  >"$out/flood.json" &
flood=$!
sleep 2
b_chats during
wait "$flood"
echo "flood from tenant a: $(cat "$out/flood.json")"
python3 bench/feedback_flood.py timing --url "$url" --owner key-b --asker key-a --n 300
echo "(files in $out)"
