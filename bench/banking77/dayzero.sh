#!/usr/bin/env bash
# Day 0 on Banking77: a head trained from K rows per label of split.py's train rows (`tiergate train
# --per-label K`), a small labelled dev set of K rows per label of split.py's dev rows (per_label.py), and the
# judge's scores over the 30% most ambiguous rows of that dev set and of the untouched test rows
# (judges.sh), so the fusion is fitted on the small dev set and measured on test.
#
# usage: bench/banking77/dayzero.sh K JUDGE [described]   e.g. 10 qwen0.5 described
#   described: the head's label descriptions (bench/banking77/labels.tsv through `train --labels`) reach the
#   judge's prompts; without it the same head with its descriptions removed (label names only).
# Needs /tmp/b77/{train,dev,test}.csv (split.py). Writes /tmp/b77/kK/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
k="$1" judge="$2" variant="${3:-names}"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
d=/tmp/b77/k$k
mkdir -p "$d"
[[ -s $d/dev.csv ]] || python3 bench/banking77/per_label.py /tmp/b77/dev.csv "$k" 7 >"$d/dev.csv"
[[ -s $d/test.csv ]] || cp /tmp/b77/test.csv "$d/test.csv"
if [[ ! -f $d/head-described/head.json ]]; then
  "$bin" train --encoder models/all-MiniLM-L6-v2 --data /tmp/b77/train.csv --per-label "$k" --seed 1 \
    --labels bench/banking77/labels.tsv --out "$d/head-described" --rows-out "$d/head_rows.csv"
fi
if [[ ! -f $d/head-names/head.json ]]; then
  cp -r "$d/head-described" "$d/head-names"
  python3 - "$d/head-names/head.json" <<'PY'
import json, sys
p = sys.argv[1]
h = json.load(open(p))
h.pop("descriptions", None)
json.dump(h, open(p, "w"), indent=2)
PY
fi
for split in dev test; do
  HEAD="$d/head-$variant" SPLITS="$d" ROWS="$d/rows" TAG="-$variant" \
    bench/banking77/judges.sh "$judge" auto "$split" 0.3
done
