#!/usr/bin/env bash
# The whole test suite: fetch the models (once), make sure the `openai` and `anthropic` Python packages (conformance tests),
# llama-cpp-python's server (openai engine test), Prometheus and Redis (fleet and replica tests) are there, then every
# unit, integration, multi-process and real-model test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-models.sh
# The Qwen2.5-Coder-0.5B judge (~470 MiB): its forward parity and choice tests (tests/tests/real_qwen.rs).
scripts/fetch-models.sh --judge qwen2.5-0.5b
python="${PYTHON:-python3}"
if ! "$python" -c "import openai" >/dev/null 2>&1; then
  echo "test: installing the openai Python package (conformance test)" >&2
  "$python" -m pip install --quiet "openai>=1.40" || { echo "test: cannot install openai with pip" >&2; exit 1; }
fi
if ! "$python" -c "import anthropic" >/dev/null 2>&1; then
  echo "test: installing the anthropic Python package (Messages door test)" >&2
  "$python" -m pip install --quiet "anthropic>=0.40" || { echo "test: cannot install anthropic with pip" >&2; exit 1; }
fi
if ! "$python" -c "import llama_cpp.server" >/dev/null 2>&1; then
  # The openai engine's test runs a real llama.cpp server (llama-cpp-python has no binary wheels: this
  # compiles llama.cpp once, a few minutes; pip keeps the wheel it built and reinstalls from it). Generic x86-64
  # flags: a native build can use instructions the CPU reports but the VM does not allow. Without libmtmd
  # (LLAVA_BUILD=OFF): the multimodal library only a llava/mtmd chat format loads, which no test uses.
  echo "test: installing llama-cpp-python[server] (real upstream for the openai engine test)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF}" \
    "$python" -m pip install --quiet "llama-cpp-python[server]==0.3.36" \
    || { echo "test: cannot install llama-cpp-python[server] with pip" >&2; exit 1; }
fi
for module in kubernetes_validate:kubernetes-validate websocket:websocket-client opentelemetry.proto:opentelemetry-proto grpc:grpcio; do
  # kubernetes-validate: schema check of deploy/k8s; websocket-client: drives Chromium for the /console test;
  # opentelemetry-proto and grpcio: the OTLP receiver (HTTP and gRPC) of the tracing test.
  if ! "$python" -c "import ${module%%:*}" >/dev/null 2>&1; then
    echo "test: installing ${module#*:}" >&2
    "$python" -m pip install --quiet "${module#*:}" || { echo "test: cannot install ${module#*:}" >&2; exit 1; }
  fi
done
# The agent CLIs people run (tests/tests/agents.rs): Claude Code and Codex CLI, pinned, from npm, kept outside
# the clone so that a CI run installs them once (a fresh install takes about 20 s here).
agents="${TIERGATE_AGENTS_DIR:-$HOME/.cache/tiergate/agents}"
claude_version=2.1.328
codex_version=0.169.0
if ! "$agents/node_modules/.bin/claude" --version 2>/dev/null | grep -q "^$claude_version " \
  || ! "$agents/node_modules/.bin/codex" --version 2>/dev/null | grep -q " $codex_version$"; then
  command -v npm >/dev/null 2>&1 || { echo "test: npm (Node.js) is needed for the agent CLIs' tests" >&2; exit 1; }
  echo "test: installing Claude Code $claude_version and Codex CLI $codex_version from npm" >&2
  mkdir -p "$agents"
  npm install --silent --no-audit --no-fund --prefix "$agents" \
    "@anthropic-ai/claude-code@$claude_version" "@openai/codex@$codex_version" \
    || { echo "test: cannot install the agent CLIs with npm" >&2; exit 1; }
fi
export TIERGATE_AGENTS_DIR="$agents"
# Debian packages of the real components some tests start: Prometheus (fleet utilisation, rules), Redis
# (replicas sharing one policy), Chromium (the /console page in a real browser).
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "test: installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  # A fresh machine's package lists may be empty or stale: refresh them first.
  $sudo_cmd apt-get update -qq >/dev/null || { echo "test: apt-get update failed" >&2; exit 1; }
  $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "test: cannot install ${missing[*]} with apt-get" >&2; exit 1; }
fi
# The llama.cpp engine's build tools (cmake, clang, libclang) and its OpenMP runtime.
scripts/build-deps.sh
# The end-to-end tests run the workspace's binaries (`tiergate`, `tiergate-reranker`): `cargo test` builds
# only the binaries of packages that have integration tests of their own, so build them all first (the same
# dependency builds: see hack/).
t=$SECONDS
cargo build --workspace --bins
echo "test: the binaries' build took $((SECONDS - t)) s (installs and fetches before it: $t s)" >&2
# cargo-nextest runs every test in its own process, two at a time across test binaries (.config/nextest.toml
# keeps the LLM tests one at a time and the latency tests alone); `cargo test` runs the same tests one binary
# after another (1,026 s against 779 s here: docs/benchmarks.md). It is installed once when missing (282 s here
# from an empty cargo home, about what one `cargo test` run loses), in its own temporary target directory; if
# that fails, `cargo test` runs.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "test: installing cargo-nextest (once, a few minutes)" >&2
  env -u CARGO_TARGET_DIR cargo install --quiet --locked cargo-nextest --version 0.9.151 \
    || echo "test: cannot install cargo-nextest: running cargo test" >&2
fi
t=$SECONDS
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-targets --features tiergate-tests/real "$@"
else
  cargo test --workspace --all-targets --features tiergate-tests/real "$@"
fi
echo "test: the test build and every test took $((SECONDS - t)) s" >&2
