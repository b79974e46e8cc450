#!/usr/bin/env bash
# The instruction budgets CI holds (`.ci/run`): valgrind's callgrind counts the instructions
# condenser executes for
#   chat     one plain chat request (the mean of 20, each on a new connection);
#   under    one agent request under every trigger (a 181-round Messages session, 2M window);
#   compact  one compacted agent request (the same session in a 150k window, the form it
#            went with on record and kept: its middle cut, or its oldest rounds in a stand-in;
#            the least of three counts);
# and compares each with bench/instruction_budgets (the measured figure plus 10%). Counts,
# unlike times, repeat from run to run on a shared machine, so a budget passed is a change,
# not noise. A change that must cost more raises its budget in the same commit and says why.
#
#   bash bench/instruction_budget.sh BINARY            # fails when a budget is passed
#   bash bench/instruction_budget.sh BINARY --measure  # prints the figures and budgets
#
# CALLGRIND_OUT=PREFIX keeps each counted dump as PREFIX.NAME (the last of the compact counts),
# for callgrind_annotate.
#
# Needs valgrind (installed when missing, as root) and python3.
set -euo pipefail
SCRIPT=instruction-budget
source "$(dirname "${BASH_SOURCE[0]}")/replay_common.sh"
MEASURE=${2:-}
BUDGETS=$ROOT/bench/instruction_budgets
if ! command -v valgrind >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "valgrind is needed: apt-get install -y valgrind" >&2; exit 1; }
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi

python3 "$ROOT/bench/agent_bodies.py" "$WORK/wide" messages claude-bench-wide 180 181 >/dev/null
python3 "$ROOT/bench/agent_bodies.py" "$WORK/small" messages claude-bench-small 180 181 >/dev/null
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
TOML
(cd "$WORK" && RUST_LOG=info exec valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    "$BIN" --config "$WORK/condenser.toml" --log-format json) 2>"$WORK/condenser.log" &
PIDS+=("$!")
# Named in every callgrind_control call: without a pid, it zeroes and dumps every callgrind
# run on the machine.
VALGRIND_PID=$!
for _ in $(seq 600); do curl -s -o /dev/null "http://127.0.0.1:$PORT/healthz" && break; sleep 0.2; done

send() { # $1 = path, $2 = body file
    curl -s -o /dev/null -w '%{http_code}' --max-time 300 -X POST "http://127.0.0.1:$PORT$1" \
        -H 'content-type: application/json' -H 'x-api-key: sk-bench' --data-binary "@$2"
}
last_outcome() { # the action/cache of the last request logged
    grep '"overhead_ms"' "$WORK/condenser.log" | tail -1 |
        python3 -c 'import json,sys; l=json.loads(sys.stdin.read()); print(l["action"] + "/" + l["cache"])'
}
count() { # $1 = name, $2 = requests, then the command that sends them; prints per request
    local name=$1 requests=$2 dump
    shift 2
    callgrind_control --zero "$VALGRIND_PID" >/dev/null 2>&1
    "$@"
    callgrind_control --dump "$VALGRIND_PID" >/dev/null 2>&1
    dump=$(ls -t "$WORK"/callgrind.out.* | head -1)
    echo "$name $(($(awk '/^(summary|totals):/ {print $2; exit}' "$dump") / requests))"
    [ -z "${CALLGRIND_OUT:-}" ] || cp "$dump" "$CALLGRIND_OUT.$name"
    rm -f "$WORK"/callgrind.out.*
}
chat_requests() {
    for _ in $(seq 20); do [ "$(send /v1/chat/completions "$WORK/chat.json")" = 200 ] || exit 1; done
}
one() { [ "$(send /v1/messages "$1")" = 200 ] || exit 1; }

echo '{"model":"gpt-4o","messages":[{"role":"user","content":"How far is the moon?"}]}' >"$WORK/chat.json"
# Warm-ups: encodings built, the session's messages counted. The wide session is counted
# before the small one is summarized, so no summary job runs while it is.
send /v1/chat/completions "$WORK/chat.json" >/dev/null
one "$WORK/wide/messages-0180.json"
figures=$(
    count chat 20 chat_requests
    count under 1 one "$WORK/wide/messages-0181.json"
    [ "$(last_outcome)" = forwarded/none ] || { echo "under: $(last_outcome)" >&2; exit 1; }
)
# The small session's form on record, then its next request counted: the form in use kept
# (`hit`), its middle cut or its oldest rounds in a stand-in, as the request that first went
# over the hard limit took it (a stand-in when a cut cannot reach the target).
kept() { case "$(last_outcome)" in trimmed/hit | summarized/hit) return 0 ;; *) return 1 ;; esac; }
for _ in $(seq 60); do
    one "$WORK/small/messages-0180.json"
    kept && break
    sleep 1
done
kept || { echo "no form on record: $(last_outcome)" >&2; exit 1; }
# The least of three counts of the same request: a summary job made ahead in the background
# (its work is condenser's too, but not this request's) may overlap one count where valgrind's
# slowdown and a busy machine stretch it, and counted once it read 60M and 88M against 42M.
compact=$(
    for _ in 1 2 3; do
        count compact 1 one "$WORK/small/messages-0181.json"
        kept || { echo "compact: $(last_outcome)" >&2; exit 1; }
    done | sort -k2 -n | head -1
)
figures+=$'\n'$compact
if [ "$MEASURE" = --measure ]; then
    awk '{printf "%s %d   # measured %d\n", $1, $2 * 1.1, $2}' <<<"$figures"
    exit 0
fi
failed=0
while read -r name measured; do
    budget=$(awk -v n="$name" '$1 == n {print $2}' "$BUDGETS")
    [ -n "$budget" ] || { echo "no budget for $name in $BUDGETS" >&2; exit 1; }
    verdict=ok
    [ "$measured" -le "$budget" ] || { verdict="OVER BUDGET"; failed=1; }
    printf '%-8s %12d instructions, budget %12d: %s\n' "$name" "$measured" "$budget" "$verdict"
done <<<"$figures"
exit "$failed"
