#!/usr/bin/env bash
# The day-0 figures from dayzero.sh's rows: for each judge and variant, the fusion is fitted on the small dev
# set's rows (`tiergate fit-fusion --from-rows`, into a copy of the head) and measured on the test rows at 10%
# and 20% escalation (rows_report.py: Tier-0 alone, the LLM alone, the fusion, rows fixed/broken, sign test).
# Nothing is chosen on test rows.
#
# usage: bench/banking77/dayzero_report.sh K [JUDGE...]   (default judges: qwen0.5 qwen1.5)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
k="$1"
shift
judges=("${@:-qwen0.5 qwen1.5}")
[[ $# -gt 0 ]] || judges=(qwen0.5 qwen1.5)
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
d=/tmp/b77/k$k
python3 - "$d/test.csv" "$d/rows/qwen0.5-auto-test-0.3-names.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
ok = sum(r["tier0"][0]["label"] == r["gold"] for r in rows)
print(f"K = {sys.argv[1].split('/')[-2][1:]}: Tier-0 alone on test {ok / len(rows):.4f} ({ok}/{len(rows)} rows)")
PY
for judge in "${judges[@]}"; do
  for variant in names described; do
    rows="$d/rows/$judge-auto"
    [[ -s $rows-dev-0.3-$variant.jsonl && -s $rows-test-0.3-$variant.jsonl ]] || continue
    fit="$d/fit-$judge-$variant"
    rm -rf "$fit" && cp -r "$d/head-$variant" "$fit"
    "$bin" fit-fusion --classifier "$fit" --data "$d/dev.csv" --split all \
      --from-rows "$rows-dev-0.3-$variant.jsonl" >"$fit/fit.log" 2>&1
    echo "== $judge, $variant: fusion fitted on dev $(python3 -c "import json,sys; f=json.load(open(sys.argv[1])); print(f'w = {f[\"llm_weight\"]}, T = {f[\"llm_temperature\"]}')" "$fit/fusion.json")"
    for share in 0.1 0.2; do
      python3 bench/banking77/rows_report.py "$rows-test-0.3-$variant.jsonl" "$fit/fusion.json" "$share"
    done
  done
done
