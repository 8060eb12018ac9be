#!/usr/bin/env bash
# Tier-0's encoder against onnxruntime (fp32 and dynamic int8) on the same texts, tokenizer and 2 cores, in
# one run: prints one JSON line per engine and precision. Run it on a quiet machine.
#
# usage: bench/encoder_peers.sh [TEXTS_FILE]   (one text per line)
#   default texts: 1,000 Banking77 queries from ../shared/data/banking77/train.csv when it is there, else the
#   repository's bench/workloads/bank24.jsonl.
# Needs: python3 -m pip install onnxruntime==1.32.0 onnx tokenizers; scripts/fetch-models.sh (MiniLM);
# bench/fetch-onnx-minilm.sh (the ONNX graph).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
texts="${1:-}"
if [[ -z "$texts" ]]; then
  texts="$(mktemp)"
  trap 'rm -f "$texts"' EXIT
  python3 - "$root" "$texts" <<'PY'
import csv, json, random, sys
from pathlib import Path
root, out = Path(sys.argv[1]), sys.argv[2]
b77 = root.parent / "shared/data/banking77/train.csv"
if b77.exists():
    rows = [r[0] for r in csv.reader(open(b77))][1:]
    random.Random(7).shuffle(rows)
    rows = rows[:1000]
else:
    rows = [json.loads(l)["text"] for l in open(root / "bench/workloads/bank24.jsonl")]
open(out, "w").write("\n".join(rows) + "\n")
PY
fi
bench/fetch-onnx-minilm.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cargo build -q -p tiergate-prefilter --example encoder_bench
bin="$CARGO_TARGET_DIR/debug/examples/encoder_bench"
for p in int8 f32; do
  if [[ "$p" == int8 ]] && ! grep -q avx512_vnni /proc/cpuinfo; then continue; fi
  "$bin" models/all-MiniLM-L6-v2 "$texts" "$p"
done
python3 bench/onnxruntime_encoder.py "$texts" --threads 2
