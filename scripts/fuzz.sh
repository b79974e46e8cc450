#!/usr/bin/env bash
# Runs each fuzz target of fuzz/ for SECONDS (60 at most) from its committed seed corpus, and
# fails on any crash; prints each target's executions. cargo fuzz needs a nightly toolchain
# (rustup's `nightly`) and cargo-fuzz, installed from crates.io when missing. New inputs found
# go to a temporary directory, not into the committed corpus. A crash leaves its input under
# fuzz/artifacts/TARGET/: make it a regression test.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
[ "$SECONDS_EACH" -le 60 ] || { echo "fuzz.sh: at most 60 s a target" >&2; exit 2; }
rustup toolchain list | grep -q '^nightly' || {
  echo "fuzz.sh: cargo fuzz needs rustup's nightly toolchain, and this machine has none" >&2
  exit 1
}
command -v cargo-fuzz >/dev/null || cargo install --locked --quiet cargo-fuzz
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(cargo +nightly fuzz list --fuzz-dir fuzz)
WORK=$(mktemp -d /tmp/condenser-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cargo +nightly fuzz build --fuzz-dir fuzz -O
for target in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$target"
  cargo +nightly fuzz run --fuzz-dir fuzz -O "$target" "$WORK/$target" "fuzz/corpus/$target" \
    -- -max_total_time="$SECONDS_EACH" -print_final_stats=1 >"$WORK/$target.log" 2>&1 || {
    tail -40 "$WORK/$target.log" >&2
    echo "fuzz.sh: $target crashed; its input is under fuzz/artifacts/$target/" >&2
    exit 1
  }
  runs=$(awk '/stat::number_of_executed_units:/ { print $2 }' "$WORK/$target.log")
  echo "fuzz $target: ${runs:-?} executions in ${SECONDS_EACH} s, 0 crashes"
done
