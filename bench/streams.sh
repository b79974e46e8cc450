#!/usr/bin/env bash
# Peak memory with many SSE streams open at once: for each count (1k, 5k, 9k by default), a
# fresh condenser in front of an upstream that holds every stream open for HOLD seconds
# (bench/streams.py), COUNT streamed chat requests at once, then condenser's peak RSS
# (VmHWM) and how many streams ended with [DONE]. Each stream holds two descriptors in
# condenser (client and upstream), so 9k needs an open-files hard limit above 18k.
#
#   bash bench/streams.sh [BINARY] [COUNTS...]     # default: a `cargo build --release` binary
set -euo pipefail
SCRIPT=streams
source "$(dirname "${BASH_SOURCE[0]}")/replay_common.sh"
shift || true
if [ $# -gt 0 ]; then COUNTS=("$@"); else COUNTS=(1000 5000 9000); fi
HOLD=${HOLD:-8}

printf '%-7s %-9s %-14s %s\n' streams complete "peak RSS MB" others
for count in "${COUNTS[@]}"; do
    UP=$(free_port)
    PORT=$(free_port)
    python3 "$ROOT/bench/streams.py" upstream "$UP" "$HOLD" & up_pid=$!
    PIDS+=("$up_pid")
    cat >"$WORK/condenser.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[upstream]
base_url = "http://127.0.0.1:$UP"
TOML
    RUST_LOG=warn "$BIN" --config "$WORK/condenser.toml" 2>"$WORK/condenser.log" & pid=$!
    PIDS+=("$pid")
    wait_up "http://127.0.0.1:$PORT/healthz"
    result=$(python3 "$ROOT/bench/streams.py" clients "$PORT" "$count")
    peak=$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status")
    python3 - "$result" "$peak" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"{r['streams']:<7} {r['complete']:<9} {sys.argv[2]:<14} {r['others'] or ''}")
PY
    kill "$pid" "$up_pid" 2>/dev/null || true
    wait "$pid" "$up_pid" 2>/dev/null || true
done
