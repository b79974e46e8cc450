#!/usr/bin/env bash
# Instructions condenser executes per request, counted by valgrind's callgrind: unlike time on
# a shared machine, the count repeats to within a percent from run to run, so it can tell
# small changes apart. Slowed down some fifty times, condenser serves the benchmark's request
# mix from a canned nginx upstream; counting starts after a warm-up.
#
#   bash bench/instructions.sh BINARY [PATH] [CONNECTIONS]
#
# PATH defaults to /v1/chat/completions (/v1/embeddings measures the pass-through relay);
# CONNECTIONS to 8. CALLGRIND_OUT=FILE keeps the counted dump there, for callgrind_annotate. Needs valgrind, nginx and wrk (installed when missing, as root).
set -euo pipefail
SCRIPT=instructions
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BIN=$(realpath "${1:?usage: bash bench/instructions.sh BINARY [PATH] [CONNECTIONS]}")
export BENCH_PATH=${2:-/v1/chat/completions}
CONNS=${3:-8}
[ -x "$BIN" ] || die "no binary at $BIN"
if ! command -v valgrind >/dev/null; then
    [ "$(id -u)" = 0 ] || die "valgrind is needed: apt-get install -y valgrind"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi

UP_PORT=$(free_port)
CONDENSER_PORT=$(free_port)
start_upstream "$UP_PORT"
condenser_config "$CONDENSER_PORT" "$UP_PORT" >"$WORK/condenser.toml"
(cd "$WORK" && RUST_LOG=warn exec valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    "$BIN" --config "$WORK/condenser.toml") 2>"$WORK/condenser.log" &
PIDS+=("$!")
# Named in every callgrind_control call: without a pid, it zeroes and dumps every callgrind
# run on the machine, and two benchmarks at once would count each other's requests.
VALGRIND_PID=$!
URL="http://127.0.0.1:$CONDENSER_PORT$BENCH_PATH"
up=0
for _ in $(seq 600); do
    curl -s -o /dev/null "http://127.0.0.1:$CONDENSER_PORT/healthz" && { up=1; break; }
    sleep 0.2
done
[ "$up" = 1 ] || die "condenser did not start under valgrind: $(tail -5 "$WORK/condenser.log")"
# An encoding is built by the first request that needs it: here, before the warm-up.
curl -s -o /dev/null --max-time 600 "http://127.0.0.1:$CONDENSER_PORT/v1/chat/completions" \
    -d '{"model":"'"${MIX_MODEL:-gpt-4o}"'","messages":[{"role":"user","content":"warm up"}]}'
wrk -t1 -c"$CONNS" -d3s -s "$WORK/mix.lua" "$URL" >/dev/null
callgrind_control --zero "$VALGRIND_PID" >/dev/null
out=$(wrk -t1 -c"$CONNS" -d5s -s "$WORK/mix.lua" "$URL")
callgrind_control --dump "$VALGRIND_PID" >/dev/null
grep -q 'Non-2xx' <<<"$out" && die "requests failed: $out"
requests=$(awk '/requests in/ {print $1}' <<<"$out")
# The dump holds what ran since the counters were zeroed.
instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$WORK"/callgrind.out.*)
[ -n "${CALLGRIND_OUT:-}" ] && cp "$WORK"/callgrind.out.* "$CALLGRIND_OUT"
echo "$(basename "$BIN") $BENCH_PATH c=$CONNS: $requests requests, $((instructions / requests)) instructions per request"
