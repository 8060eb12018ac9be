# Sourced by run.sh and ci.sh: a fresh start in OUT (`$out`, emptied) — an empty cargo home, target directory
# and pip cache — then a clone of `$root` at `$rev` in OUT/clone, the working directory from then on. `mark
# NAME` appends NAME's seconds since the clone began to OUT/times.txt.
rm -rf "$out" && mkdir -p "$out"
export CARGO_HOME="$out/cargo-home" CARGO_TARGET_DIR="$out/target" PIP_CACHE_DIR="$out/pip-cache"
start=$(date +%s.%N)
mark() { printf '%-24s %7.1f s\n' "$1" "$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$out/times.txt"; }
git clone -q "$root" "$out/clone"
git -C "$out/clone" checkout -q "$rev"
cd "$out/clone"
mark cloned
