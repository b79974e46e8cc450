#!/usr/bin/env bash
# One SSE event of 1, 4 and 16 MB, delivered by upstream in 16 KiB chunks: the time a client
# takes to read the whole stream through condenser (release build) and directly from the
# upstream, the best of RUNS each. A linear event reader keeps condenser's time proportional
# to the size (issue 37: it was 0.06 s, 0.51 s, 7.34 s). Needs python3 and curl.
#
# usage: bench/big_event.sh [RUNS]
set -euo pipefail
SCRIPT=big_event
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-3}
BIN=$ROOT/target/release/condenser
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release)

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

BODY='{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}'
best() { # $1 = url: the least time_total of RUNS reads of the whole stream
    local best="" t
    for _ in $(seq "$RUNS"); do
        t=$(curl -s -o /dev/null -w '%{time_total}' -H 'authorization: Bearer sk-bench-key-0001' \
            -H 'content-type: application/json' -d "$BODY" "$1")
        best=$(awk -v a="$t" -v b="$best" 'BEGIN { print (b == "" || a < b) ? a : b }')
    done
    echo "$best"
}

printf '%-8s %12s %12s\n' size direct_s condenser_s
for mb in 1 4 16; do
    up=$(port); proxy=$(port)
    python3 "$ROOT/bench/big_event_upstream.py" "$up" $((mb * 1000 * 1000)) & PIDS+=($!)
    wait_up "$up"
    CONDENSER_LISTEN=127.0.0.1:$proxy CONDENSER_UPSTREAM=http://127.0.0.1:$up \
        RUST_LOG=warn "$BIN" --config /dev/null >/dev/null 2>&1 & PIDS+=($!)
    wait_up "$proxy"
    direct=$(best "http://127.0.0.1:$up/v1/chat/completions")
    through=$(best "http://127.0.0.1:$proxy/v1/chat/completions")
    printf '%-8s %12s %12s\n' "${mb} MB" "$direct" "$through"
done
