#!/usr/bin/env bash
# The judges on Banking77 (issue 19): the LLM's scores over the most ambiguous rows of our dev and test splits
# (bench/banking77/split.py), one JSON line per row (`eval --hybrid --rows`), so the fusion is fitted on dev
# and measured on test from the same scores (`fit-fusion --from-rows`, `eval --hybrid --from-rows`).
#
# usage: bench/banking77/judges.sh JUDGE METHOD SPLIT SHARE [K]   e.g. qwen1.5 choice dev 0.3 2
#   JUDGE: smollm2 | qwen0.5 | qwen1.5;  METHOD: auto | choice | channel | likelihood;  SPLIT: dev | test
#   K: with METHOD choice, examples per option (the K nearest the query; default 0)
# Environment: TAG (a suffix for the output files) and SETS (more `--set` values, separated by `;`).
# Needs /tmp/b77/{dev,test}.csv and a head in /tmp/b77/head (tiergate train … --out /tmp/b77/head); HEAD, SPLITS
# (the folder of the split CSVs) and ROWS (where the rows go) name others.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
judge="$1" method="$2" split="$3" share="$4" k="${5:-0}"
case "$judge" in
  smollm2) model="models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  qwen0.5) model="models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
  qwen1.5) model="models/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
  *) echo "unknown judge $judge" >&2; exit 2 ;;
esac
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tiergate"
out="${ROWS:-/tmp/b77/rows}"
mkdir -p "$out"
tag="$judge-$method-$split-$share"
if [[ "$k" != 0 ]]; then tag="$judge-$method-k$k-$split-$share"; fi
tag="$tag${TAG:-}"
extra=()
IFS=';' read -r -a more <<<"${SETS:-}"
for s in "${more[@]}"; do [[ -n "$s" ]] && extra+=(--set "$s"); done
"$bin" eval --classifier "${HEAD:-/tmp/b77/head}" --data "${SPLITS:-/tmp/b77}/$split.csv" --hybrid --json \
  --max-escalated "$share" --rows "$out/$tag.jsonl" \
  --set "reranker.model=\"$model\"" --set "reranker.prompts.method=\"$method\"" \
  --set "reranker.prompts.choice_examples=$k" "${extra[@]}" >"$out/$tag.json"
echo "wrote $out/$tag.jsonl"
