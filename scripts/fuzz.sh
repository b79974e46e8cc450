#!/usr/bin/env bash
# Runs each fuzz target of fuzz/ for SECONDS (45 unless told, 60 at most) from its committed
# seed corpus, and fails on any crash; prints each target's executions. .ci/run runs it.
#
# Stable Rust is enough: without a sanitizer (`--sanitizer none`) cargo fuzz passes rustc only
# stable flags (libFuzzer's coverage passes), so a panic, an overflow (`--debug-assertions`) or
# a timeout is what a target finds, not a memory error: the library has no `unsafe` of its
# own (main.rs's setrlimit is not fuzzed), and an address-sanitizer build needs nightly and took
# over 40 minutes on a 2-core machine. `--codegen-units 16` undoes cargo fuzz's default of one
# codegen unit a crate: that buys faster execution with a slower build, and CI's budget is the
# build.
#
# cargo-fuzz is installed from crates.io when missing (its version pinned: the flags above are
# its). New inputs found go to a temporary directory, not into the committed corpus. A crash
# leaves its input under fuzz/artifacts/TARGET/, and the run's log beside it: make it a
# regression test beside the code.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-45}
shift || true
[ "$SECONDS_EACH" -le 60 ] || { echo "fuzz.sh: at most 60 s a target" >&2; exit 2; }
cargo fuzz --version >/dev/null 2>&1 || cargo install --locked --quiet cargo-fuzz@0.13.2
BUILD=(--fuzz-dir fuzz --sanitizer none --release --debug-assertions --codegen-units 16)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(cargo fuzz list --fuzz-dir fuzz)
WORK=$(mktemp -d /tmp/condenser-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# The committed fuzz/Cargo.lock as it is (cargo fuzz build has no --locked).
cargo fetch --locked --manifest-path fuzz/Cargo.toml
cargo fuzz build "${BUILD[@]}"
for target in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$target"
  # -timeout: an input that takes 10 s is a finding too (the proxy would hold a worker on it).
  cargo fuzz run "${BUILD[@]}" "$target" "$WORK/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$SECONDS_EACH" -timeout=10 -print_final_stats=1 >"$WORK/$target.log" 2>&1 || {
    mkdir -p fuzz/artifacts
    cp "$WORK/$target.log" "fuzz/artifacts/$target.log"
    # What failed and where its input is, without the backtraces.
    grep -A1 -m1 -e 'panicked at' -e 'ERROR: libFuzzer' "fuzz/artifacts/$target.log" >&2 || true
    grep -A2 -e '^Failing input' -e '^Reproduce with' "fuzz/artifacts/$target.log" >&2 || true
    echo "fuzz.sh: $target failed; its log is fuzz/artifacts/$target.log" >&2
    exit 1
  }
  runs=$(awk '/stat::number_of_executed_units:/ { print $2 }' "$WORK/$target.log")
  echo "fuzz $target: ${runs:-?} executions in ${SECONDS_EACH} s, 0 crashes"
done
