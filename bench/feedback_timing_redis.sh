#!/usr/bin/env bash
# Feedback on unknown against foreign ids with the ledger in Redis: one `tiergate serve` (stub engine, θ = 1)
# whose policy store — and so its ledger — is a real `redis-server` on a free loopback port, tenants a and b;
# a gives feedback N times on b's real id, N times on one id nobody was given (b's with its last digit
# changed) and N times on a fresh unknown id, the three in a random order each round
# (`bench/feedback_flood.py timing`), and the Kolmogorov–Smirnov test compares the timings. The commands
# each lookup costs are counted by `engine/src/evidence/ledger/redis.rs`'s
# `unknown_and_foreign_ids_cost_the_same_reads`.
#
#   bench/feedback_timing_redis.sh [N]      (default 1000)
#
# BIN is the folder holding `tiergate` (default: $CARGO_TARGET_DIR/debug or target/debug). Run from the
# repository root on a quiet machine.
set -euo pipefail
bin="${BIN:-${CARGO_TARGET_DIR:-target}/debug}"
n="${1:-1000}"
out="${OUT:-$(mktemp -d)}"
port=18495 rport=16395
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >"$out/redis.log" 2>&1 &
rpid=$!
for _ in $(seq 1 50); do
  redis-cli -p "$rport" ping >/dev/null 2>&1 && break
  sleep 0.1
done
# A redis-server of an earlier run still on the port would leave this one without its store: refuse.
kill -0 "$rpid" 2>/dev/null || { echo "redis-server did not start (port $rport in use?)" >&2; exit 1; }
sha() { printf %s "$1" | sha256sum | cut -c1-64; }
tenants="tenants=[{name=\"a\",key_sha256=\"$(sha key-a)\"},{name=\"b\",key_sha256=\"$(sha key-b)\"}]"
"$bin/tiergate" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
  --set 'reranker.engine="stub"' --set 'routing.mode="static"' --set routing.theta_base=1.0 \
  --set 'policy_store.kind="redis"' --set "policy_store.url=\"redis://127.0.0.1:$rport\"" \
  --set "$tenants" >"$out/serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; kill $rpid 2>/dev/null || true; wait $rpid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
python3 bench/feedback_flood.py timing --url "http://127.0.0.1:$port" --owner key-b --asker key-a --n "$n"
echo "(files in $out)"
