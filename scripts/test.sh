#!/usr/bin/env bash
# The whole test suite: fetch the models (once), make sure the `openai` Python package is there (for the
# conformance test), then every unit, integration, multi-process and real-model test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-models.sh
python="${PYTHON:-python3}"
if ! "$python" -c "import openai" >/dev/null 2>&1; then
  echo "test: installing the openai Python package (conformance test)" >&2
  "$python" -m pip install --quiet "openai>=1.40" || { echo "test: cannot install openai with pip" >&2; exit 1; }
fi
cargo test --workspace --all-targets "$@"
