#!/usr/bin/env bash
# condenser's own time per agent-sized request (issue 20's speed goals): Claude Code-like
# Messages sessions and Codex-like Responses sessions of 180 to 221 tool rounds (550 to 800 KB,
# about 120k to 175k tokens) replayed against a release build in front of an instant upstream.
# Cases, each a session grown by one round a request, then the last body sent again:
#   under    every trigger (a window of 2M tokens): forwarded byte for byte;
#   off      `x-condenser-mode: off`;
#   observe  `x-condenser-mode: observe` in the 150k window: forwarded byte for byte, auto's plan
#            in the reply's headers; what auto would do is carried out after the request left,
#            out of the time measured;
#   compact  a 150k window: compacted, with the summary on hand (the first request makes it
#            and is left out).
# The time is the log line's `overhead_ms`: condenser's work, upstream and summarizer calls
# excluded. Prints p50 and p95 per API and case.
#
#   bash bench/agent_replay.sh [BINARY]      # default: a `cargo build --release` binary
#   CASES="compact" RUNS=3 bash bench/agent_replay.sh BINARY   # some cases, each run 3 times
set -euo pipefail
SCRIPT=agent-replay
source "$(dirname "${BASH_SOURCE[0]}")/replay_common.sh"

for model in wide small; do
    python3 "$ROOT/bench/agent_bodies.py" "$WORK/$model" messages "claude-bench-$model" 180 221
    python3 "$ROOT/bench/agent_bodies.py" "$WORK/$model" responses "gpt-bench-$model" 180 221
done
UP=$(free_port)
PORT=$(free_port)
python3 "$ROOT/bench/agent_upstream.py" "$UP" & PIDS+=("$!")
cat >"$WORK/condenser.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[upstream]
base_url = "http://127.0.0.1:$UP"
[models."claude-bench-wide"]
context_window = 2000000
encoding = "o200k_base"
[models."claude-bench-small"]
context_window = 150000
encoding = "o200k_base"
[models."gpt-bench-wide"]
context_window = 2000000
encoding = "o200k_base"
[models."gpt-bench-small"]
context_window = 150000
encoding = "o200k_base"
TOML
RUST_LOG=info "$BIN" --config "$WORK/condenser.toml" --log-format json 2>"$WORK/condenser.log" & PIDS+=("$!")
wait_up "http://127.0.0.1:$PORT/healthz"
wait_up "http://127.0.0.1:$UP/" || true

send() { # $1 = api, $2 = body file, $3 = mode; prints nothing
    curl -s -o /dev/null -X POST "http://127.0.0.1:$PORT/v1/$1" -H 'content-type: application/json' \
        -H "x-condenser-mode: $3" -H 'x-api-key: sk-bench' --data-binary "@$2"
}
replay() { # $1 = case, $2 = api path, $3 = file prefix, $4 = bodies dir, $5 = mode
    local first=1 file
    for file in "$4/$3"-*.json "$4/$3"-0221.json; do
        echo "mark $1 $3 $( [ $first = 1 ] && echo skip || echo keep )" >>"$WORK/marks"
        send "$2" "$file" "$5"
        first=0
    done
}
: >"$WORK/marks"
CASES=${CASES:-under off observe compact}
RUNS=${RUNS:-1}
for api in messages:messages responses:responses; do
    path=${api%%:*}; prefix=${api##*:}
    for case in $CASES; do
        for run in $(seq "$RUNS"); do
            name=$case$([ "$RUNS" = 1 ] || echo "$run")
            case $case in
                under) replay "$name" "$path" "$prefix" "$WORK/wide" auto ;;
                off | observe) replay "$name" "$path" "$prefix" "$WORK/small" "$case" ;;
                compact) replay "$name" "$path" "$prefix" "$WORK/small" auto ;;
                *) echo "unknown case: $case" >&2; exit 1 ;;
            esac
        done
    done
done
sleep 0.5
python3 - "$WORK/marks" "$WORK/condenser.log" <<'PY'
import json, sys
marks = [line.split()[1:] for line in open(sys.argv[1])]
lines = [json.loads(l) for l in open(sys.argv[2]) if '"overhead_ms"' in l]
lines = [l for l in lines if l.get("path") in ("/v1/messages", "/v1/responses")]
assert len(lines) == len(marks), (len(lines), len(marks))
cases = {}
for (case, api, keep), line in zip(marks, lines):
    if keep == "keep":
        cases.setdefault((api, case), []).append((line["overhead_ms"], line["action"], line["cache"], line["prompt_tokens"]))
print(f"{'api':<10} {'case':<8} {'n':>3} {'p50 ms':>8} {'p95 ms':>8}  actions / cache, prompt tokens")
for (api, case), rows in cases.items():
    times = sorted(r[0] for r in rows)
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    actions = sorted({f"{r[1]}/{r[2]}" for r in rows})
    tokens = f"{min(r[3] for r in rows)}-{max(r[3] for r in rows)}"
    print(f"{api:<10} {case:<8} {len(rows):>3} {p(0.5):>8.2f} {p(0.95):>8.2f}  {', '.join(actions)}, {tokens}")
PY
