#!/usr/bin/env bash
# What one stream costs condenser's memory: one SSE event of SIZE MB (48 unless told) that
# never ends, delivered by upstream in 16 KiB chunks, read by a client that sends a key (so the
# key scrub reads the stream too), on the chat route (usage tap) and on a pass-through path.
# Prints condenser's resident memory before and its peak after (VmHWM), a fresh process for
# each path. Issue 55: a stream held several copies of an event (RSS 11 to 312 MB on the chat
# route, 212 MB on pass-through, for 48 MiB); one copy at most now. Needs python3 and curl.
#
# usage: bench/stream_memory.sh [SIZE_MB] [BINARY]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MB=${1:-48}
BIN=${2:-$ROOT/target/release/condenser}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release)

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
kb() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$2/status"; }

BODY='{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}'
up=$(port)
python3 "$ROOT/bench/big_event_upstream.py" "$up" $((MB * 1024 * 1024)) open & PIDS+=($!)
wait_up "$up"
printf '%-22s %10s %10s\n' path rss_mb peak_mb
for path in /v1/chat/completions /v1/embeddings; do
    proxy=$(port)
    CONDENSER_LISTEN=127.0.0.1:$proxy CONDENSER_UPSTREAM=http://127.0.0.1:$up \
        RUST_LOG=error "$BIN" --config /dev/null >/dev/null 2>&1 & pid=$!; PIDS+=($pid)
    wait_up "$proxy"
    before=$(kb VmRSS "$pid")
    curl -s -o /dev/null -H 'authorization: Bearer sk-bench-key-0001' \
        -H 'content-type: application/json' -d "$BODY" "http://127.0.0.1:$proxy$path"
    peak=$(kb VmHWM "$pid")
    printf '%-22s %10.1f %10.1f\n' "$path" "$(echo "$before / 1024" | bc -l)" "$(echo "$peak / 1024" | bc -l)"
    kill "$pid"; wait "$pid" 2>/dev/null || true
done
