#!/usr/bin/env bash
# `.ci/run` from nothing, timed: a fresh clone of REV, an empty cargo home (every crate downloaded again), an
# empty target directory and persistent checkout (`.ci/run`'s, in OUT/ci), an empty pip cache and a fresh Python
# virtual environment first on PATH (so every Python package the tests use is installed again and
# llama-cpp-python compiled). Debian packages and the Rust toolchain (with cargo-nextest) stay as the machine
# has them. Writes OUT/ci.log (`.ci/run`'s output, each step's time in it) and OUT/times.txt.
#
# usage: bench/coldstart/ci.sh [REV] [OUT]     (defaults HEAD /tmp/coldci)
# Run it on a quiet machine: nothing else building or testing. Its target directory took 6.5 GB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rev="${1:-HEAD}" out="${2:-/tmp/coldci}"
# The toolchain's proxies and cargo-nextest stay reachable from the usual cargo home's bin.
export PATH="$HOME/.cargo/bin:$PATH"
source "$root/bench/coldstart/fresh.sh"
# `.ci/run` tests a clean clone in its persistent checkout and target directory: make those fresh too.
export TIERGATE_CI_HOME="$out/ci"
python3 -m venv "$out/venv"
export PATH="$out/venv/bin:$PATH"
rc=0
.ci/run >"$out/ci.log" 2>&1 || rc=$?
mark ".ci/run exited $rc"
grep -E '^(ci|test): ' "$out/ci.log" | tee -a "$out/times.txt"
exit "$rc"
