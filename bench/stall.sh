#!/usr/bin/env bash
# A real redis-server paused with SIGSTOP under 32 clients (two `tiergate serve` replicas sharing it as the
# policy store, session pins, stored responses and ledger; the stub engine): the test
# tests/tests/stalls.rs with a longer pause. Prints, per phase (0 before, 1 paused, 2 after SIGCONT) and kind,
# the requests, their 503s and `store: false` answers, and p50/p99/max latency; fails where the test does.
#
#   bench/stall.sh [SECONDS]      (default 30)
#
# Run from the repository root on a quiet machine (scripts/test.sh installs redis-server).
set -euo pipefail
export TIERGATE_STALL_S="${1:-30}"
cargo build --workspace --bins --features tiergate-tests/real
cargo nextest run -p tiergate-tests --features tiergate-tests/real --test stalls --no-capture 2>&1 \
  | grep -E '^phase|PASS|FAIL|panicked'
