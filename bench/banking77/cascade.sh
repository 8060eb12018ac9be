#!/usr/bin/env bash
# Issue 24's demonstration on Banking77: the cascade MiniLM → Qwen2.5-Coder-0.5B → Qwen2.5-Coder-1.5B against
# each single-LLM hybrid at the same LLM seconds, from the judges' per-row scores (bench/banking77/judges.sh:
# two LLM workers and Tier-0 would share the 2 cores here, so the stages are scored one judge at a time and
# combined offline, as serving combines them).
#
# Fits on dev, reports on test: the small judge's first-stage fit (fusion.json), the big judge's first-stage
# fit (its own head copy, for the big-alone hybrid) and the big judge's stage fit after the small one
# (`fit-fusion --stage big`: fusion.big.json, on every dev row the small stage scored).
#
# usage: bench/banking77/cascade.sh   (needs /tmp/b77/{train,dev,test}.csv from split.py and the two judges:
#        scripts/fetch-models.sh --judge qwen2.5-0.5b / qwen2.5-1.5b). Environment: SHARE (default 0.3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
share="${SHARE:-0.3}"
b=/tmp/b77
rows=$b/rows
if [[ ! -f $b/head/head.json ]]; then
  "$bin" train --encoder models/all-MiniLM-L6-v2 --data $b/train.csv --out $b/head
fi
for judge in qwen0.5 qwen1.5; do
  for split in dev test; do
    [[ -s $rows/$judge-auto-$split-$share.jsonl ]] || bench/banking77/judges.sh "$judge" auto "$split" "$share"
  done
done
small=$rows/qwen0.5-auto
big=$rows/qwen1.5-auto
rm -rf $b/head-small $b/head-big $b/head-cascade
for h in head-small head-big; do cp -r $b/head $b/$h; done
"$bin" fit-fusion --classifier $b/head-small --data $b/dev.csv --split all --from-rows "$small-dev-$share.jsonl"
"$bin" fit-fusion --classifier $b/head-big --data $b/dev.csv --split all --from-rows "$big-dev-$share.jsonl"
cp -r $b/head-small $b/head-cascade
"$bin" fit-fusion --classifier $b/head-cascade --data $b/dev.csv --split all --stage big \
  --prior-rows "$small-dev-$share.jsonl" --from-rows "$big-dev-$share.jsonl"
out=$b/cascade
mkdir -p $out
for split in dev test; do
  "$bin" eval --classifier $b/head-cascade --data $b/$split.csv --hybrid --json \
    --from-rows "$small-$split-$share.jsonl" --stage-rows "$big-$split-$share.jsonl" >$out/cascade-$split.json
done
"$bin" eval --classifier $b/head-small --data $b/test.csv --hybrid --json --from-rows "$small-test-$share.jsonl" >$out/small-test.json
"$bin" eval --classifier $b/head-big --data $b/test.csv --hybrid --json --from-rows "$big-test-$share.jsonl" >$out/big-test.json
python3 bench/banking77/cascade_report.py $out/cascade-dev.json $out/cascade-test.json $out/small-test.json $out/big-test.json
