#!/usr/bin/env bash
# `.ci/run` from nothing, timed: a fresh clone of REV, an empty cargo home (every crate downloaded again), an
# empty target directory, an empty pip cache and a fresh Python virtual environment first on PATH (so every
# Python package the tests use is installed again and llama-cpp-python compiled). Debian packages and the Rust
# toolchain (with cargo-nextest) stay as the machine has them. Writes OUT/ci.log (`.ci/run`'s output, each
# step's time in it) and OUT/times.txt.
#
# usage: bench/coldstart/ci.sh [REV] [OUT]     (defaults HEAD /tmp/coldci)
# Run it on a quiet machine: nothing else building or testing. It needs ~25 GB of disk for the target directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rev="${1:-HEAD}" out="${2:-/tmp/coldci}"
rm -rf "$out" && mkdir -p "$out"
export CARGO_HOME="$out/cargo-home" CARGO_TARGET_DIR="$out/target" PIP_CACHE_DIR="$out/pip-cache"
# The toolchain's proxies and cargo-nextest stay reachable from the usual cargo home's bin.
export PATH="$HOME/.cargo/bin:$PATH"
python3 -m venv "$out/venv"
export PATH="$out/venv/bin:$PATH"
start=$(date +%s.%N)
mark() { printf '%-24s %7.1f s\n' "$1" "$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$out/times.txt"; }
git clone -q "$root" "$out/clone"
git -C "$out/clone" checkout -q "$rev"
cd "$out/clone"
mark cloned
rc=0
.ci/run >"$out/ci.log" 2>&1 || rc=$?
mark ".ci/run exited $rc"
grep -E '^(ci|test): ' "$out/ci.log" | tee -a "$out/times.txt"
exit "$rc"
