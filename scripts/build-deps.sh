#!/usr/bin/env bash
# Installs what building the LLM worker needs besides Rust: the llama.cpp engine compiles llama.cpp from source
# with cmake and a C/C++ compiler, and generates its bindings with bindgen (clang's libclang); running it needs
# the OpenMP runtime (libgomp1). On Debian/Ubuntu it installs the missing ones with apt-get (as root, or through
# sudo); elsewhere, or without either, it says what to install and fails.
set -euo pipefail
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || compgen -G "/usr/lib/*/libclang*.so*" >/dev/null
}
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v clang >/dev/null 2>&1 || missing+=(clang)
have_libclang || missing+=(libclang-dev)
compgen -G "/usr/lib/*/libgomp.so.1" >/dev/null || compgen -G "/usr/lib/libgomp.so.1" >/dev/null || missing+=(libgomp1)
[ "${#missing[@]}" -eq 0 ] && exit 0
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo_cmd="sudo"
  else
    sudo_cmd="none"
  fi
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$sudo_cmd" = none ]; then
  echo "tiergate: building the llama.cpp engine needs: ${missing[*]} (Debian/Ubuntu package names;" \
    "Fedora: cmake clang clang-devel libgomp; macOS: xcode-select --install && brew install cmake llvm)." \
    "Install them and run this again." >&2
  exit 1
fi
echo "tiergate: installing the worker's build tools: ${missing[*]}" >&2
$sudo_cmd apt-get update -qq >/dev/null || { echo "tiergate: apt-get update failed" >&2; exit 1; }
$sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
  || { echo "tiergate: cannot install ${missing[*]} with apt-get" >&2; exit 1; }
