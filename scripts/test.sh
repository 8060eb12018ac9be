#!/usr/bin/env bash
# The whole test suite: fetch the models (once), then every unit, integration and real-model test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-models.sh
cargo test --workspace --all-targets "$@"
