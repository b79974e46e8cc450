# What bench/agent_replay.sh and bench/recall_round.sh share: the release binary (the one
# given, else a `cargo build --release` of this checkout), a temp dir and the processes
# started, cleaned up on exit, free ports, and a wait for a server to answer. Sourced, not
# run; the caller sets SCRIPT (its name, for the temp dir) and `set -euo pipefail`.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ $# -ge 1 ]; then
    BIN=$(realpath "$1")
else
    (cd "$ROOT" && cargo build --release --locked --quiet)
    BIN=$TARGET/release/condenser
fi
WORK=$(mktemp -d "/tmp/condenser-$SCRIPT.XXXXXX")
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; return 1; }
