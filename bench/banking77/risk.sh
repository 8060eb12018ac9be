#!/usr/bin/env bash
# Issue 31's coverage demonstration on Banking77: a head trained on split.py's train rows with 20% of them held
# out as its dev split (halved by `tiergate train`: one half fits the temperature and orders the θ grid, the
# other is the stored calibration rows), then `tiergate eval --risk` on split.py's untouched test rows: for
# ε = 1, 2, 5, 10% the θ chosen on the calibration rows, and over 100 random re-splits of calibration + test
# rows (θ chosen again each time) how often the realised error stayed ≤ ε, beside the naive choice.
#
# usage: bench/banking77/risk.sh   (needs /tmp/b77/{train,test}.csv from split.py). Environment: CONFIDENCE
#        (default 0.95), SPLITS (default 100).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
b=/tmp/b77
if [[ ! -f $b/head-risk/calibration.json ]]; then
  "$bin" train --encoder models/all-MiniLM-L6-v2 --data $b/train.csv --dev-fraction 0.2 --out $b/head-risk
fi
"$bin" eval --classifier $b/head-risk --data $b/test.csv --risk --confidence "${CONFIDENCE:-0.95}" \
  --coverage "${SPLITS:-100}" --latency-samples 1
