#!/usr/bin/env bash
# Builds the tiergate image from binaries built here (`cargo build --workspace --bins`, what scripts/tiergate
# builds), copied into deploy/container/Containerfile.prebuilt: no second cold build inside a container. The
# base image, when it is not there yet, is a Debian bookworm root file system made by mmdebstrap from Debian's
# packages (no image registry needed). Needs buildah (or podman) and, for the base, mmdebstrap.
#   scripts/container.sh [TAG]          # default tiergate:dev
# The multi-stage Dockerfile at the root builds everything inside instead (release profile, CUDA variant).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tag="${1:-tiergate:dev}"
base="tiergate-base:bookworm"
cargo build --quiet --workspace --bins
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp "$bin/tiergate" "$bin/tiergate-reranker" scripts/fetch-models.sh "$ctx/"
mkdir "$ctx/models"
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  echo "container: making the base $base with mmdebstrap" >&2
  mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,ca-certificates \
    --customize-hook='chroot "$1" useradd --system --uid 10001 tiergate' bookworm "$ctx/rootfs.tar"
  c="$(buildah from scratch)"
  tar -C "$(buildah mount "$c")" -xf "$ctx/rootfs.tar"
  buildah umount "$c" >/dev/null
  buildah commit --quiet "$c" "$base" >/dev/null
  buildah rm "$c" >/dev/null
  rm -f "$ctx/rootfs.tar"
fi
buildah bud --quiet --layers=false -f deploy/container/Containerfile.prebuilt --build-arg "BASE=$base" -t "$tag" "$ctx"
echo "container: built $tag" >&2
