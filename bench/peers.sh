#!/usr/bin/env bash
# condenser beside the gateways a user would otherwise run, measured in one run on one machine:
# each peer installed from the package registries at a pinned version into a folder of its own
# (bench/.peers/, gitignored), each put in front of the same scripted upstream on loopback
# (bench/peers_upstream.py), one after another.
#
#   bash bench/peers.sh [CONDENSER_BIN]
#
# 1. Pass-through cost: a small chat completion, whole and streamed, every body distinct (a
#    proxy that caches answers must not answer from its cache). For each proxy: latency added
#    over the upstream alone, p50 and p99, at concurrency 1 and 64; requests/s at 64; peak RSS
#    (VmHWM, the process and its children) once it has served at least $REQUESTS requests.
# 2. Compaction: the recorded Claude Code sessions (tests/fixtures/sessions/) sent through each
#    proxy that compacts or trims, and straight to the upstream: tokens billed with a prompt
#    cache, requests over the window, time added per request, requests the model would refuse.
#
# A peer that cannot be installed or started here is reported with the reason; the run goes on.
# Not a CI step: it installs from the registries and takes some minutes.
#
# Environment:
#   PEERS        which peers (default: "litellm headroom portkey tensorzero")
#   PEERS_DIR    where peers are installed (default bench/.peers)
#   DURATION     seconds of each wrk run (default 8)
#   REQUESTS     requests each proxy serves before its RSS is read (default 10000)
#   TOPUP        the most seconds spent topping a slow proxy up to REQUESTS (default 120)
#   PASS_THROUGH 0 to skip part 1
#   COMPACTION   0 to skip part 2
#   PACE         seconds between a session's requests (default 0.1)
#   KEEP_DIR     keep each compaction run's bodies and times there (to bill them again)
#   SESSIONS     FILE:WINDOW pairs (default both Claude Code sessions, in the windows they were
#                recorded with)
set -euo pipefail
SCRIPT=peers
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
PEERS=${PEERS:-litellm headroom portkey tensorzero}
PEERS_DIR=${PEERS_DIR:-$BENCH/.peers}
DURATION=${DURATION:-8}
REQUESTS=${REQUESTS:-10000}
COMPACTION=${COMPACTION:-1}
PASS_THROUGH=${PASS_THROUGH:-1}
PACE=${PACE:-0.1}
TOPUP=${TOPUP:-120}

# Pinned versions. LiteLLM 1.110.x's `proxy` extra asks for the package `litellm-proxy`, which
# the registry reached here does not have; 1.109.x down to 1.108.8 pin litellm-proxy-extras
# or litellm-enterprise versions it lacks (0.4.113, 0.4.110.post1; 0.1.79.post2): 1.108.7 is the
# newest whose proxy installs.
LITELLM_VERSION=1.108.7
HEADROOM_VERSION=0.42.0
PORTKEY_VERSION=1.15.2
TENSORZERO_VERSION=2026.6.0

# The one key every client sends: LiteLLM's proxy will not start without a master key, and the
# upstream takes any.
export BENCH_KEY=sk-bench-7f3a9c2e5b8d1f4a6c0e9b2d

log() { echo "$SCRIPT: $*" >&2; }
die() { log "$*"; exit 1; }

for tool in wrk zstd python3 curl; do
    if ! command -v "$tool" >/dev/null; then
        [ "$(id -u)" = 0 ] || die "$tool is needed: apt-get install -y wrk zstd"
        log "installing wrk and zstd"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk zstd >/dev/null
    fi
done

if [ $# -ge 1 ]; then
    BIN=$(realpath "$1")
else
    log "building condenser (release)"
    (cd "$ROOT" && cargo build --release --locked --quiet --bin condenser)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/condenser
fi
[ -x "$BIN" ] || die "no condenser binary at $BIN"

WORK=$(mktemp -d "/tmp/condenser-$SCRIPT.XXXXXX")
PIDS=()
stop_pid() { # $1 = pid: its process group TERMed (a peer's workers with it), then KILLed
    kill -TERM -- "-$1" 2>/dev/null || kill "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$1" 2>/dev/null || kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
set -m # each started process leads a process group of its own, so that stop_pid ends its children

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # $1 = url, $2 = seconds, $3 = the pid that should answer (given up on when it exits)
    for _ in $(seq "$((${2:-30} * 10))"); do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# --- installs --------------------------------------------------------------------------------
declare -A WHY VERSION
mkdir -p "$PEERS_DIR"
pip_peer() { # $1 = name, $2 = requirement; a venv of its own, kept once installed
    local dir=$PEERS_DIR/$1
    if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$2" ]; then return 0; fi
    rm -rf "$dir"
    python3 -m venv "$dir" || return 1
    log "installing $2 (pip, into $dir)"
    "$dir/bin/pip" install -q --disable-pip-version-check "$2" >"$dir/install.log" 2>&1 || return 1
    echo "$2" >"$dir/.installed"
}
install_peer() { # $1 = name; sets WHY[$1] when it cannot be installed
    local dir=$PEERS_DIR/$1
    case $1 in
    litellm)
        VERSION[$1]="litellm[proxy] $LITELLM_VERSION"
        pip_peer litellm "litellm[proxy]==$LITELLM_VERSION" ||
            WHY[$1]="pip install 'litellm[proxy]==$LITELLM_VERSION' failed: $(tail -2 "$dir/install.log" | tr '\n' ' ')"
        ;;
    headroom)
        VERSION[$1]="headroom-ai[proxy] $HEADROOM_VERSION"
        pip_peer headroom "headroom-ai[proxy]==$HEADROOM_VERSION" ||
            WHY[$1]="pip install 'headroom-ai[proxy]==$HEADROOM_VERSION' failed: $(tail -2 "$dir/install.log" | tr '\n' ' ')"
        ;;
    tensorzero)
        # The PyPI package carries the gateway (Rust, in its extension module) and serves it
        # over HTTP on a local port: tensorzero._start_http_gateway, what its OpenAI-client
        # patch starts.
        VERSION[$1]="tensorzero $TENSORZERO_VERSION (PyPI; the gateway in its extension module)"
        pip_peer tensorzero "tensorzero==$TENSORZERO_VERSION" ||
            WHY[$1]="pip install 'tensorzero==$TENSORZERO_VERSION' failed: $(tail -2 "$dir/install.log" | tr '\n' ' ')"
        ;;
    portkey)
        VERSION[$1]="@portkey-ai/gateway $PORTKEY_VERSION (Node $(node --version 2>/dev/null || echo '?'))"
        if ! command -v npm >/dev/null; then
            WHY[$1]="npm is not installed"
        elif [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$PORTKEY_VERSION" ]; then
            rm -rf "$dir" && mkdir -p "$dir"
            log "installing @portkey-ai/gateway@$PORTKEY_VERSION (npm, into $dir)"
            if (cd "$dir" && npm install --silent --no-audit --no-fund "@portkey-ai/gateway@$PORTKEY_VERSION" >install.log 2>&1); then
                echo "$PORTKEY_VERSION" >"$dir/.installed"
            else
                WHY[$1]="npm install @portkey-ai/gateway@$PORTKEY_VERSION failed: $(tail -2 "$dir/install.log" | tr '\n' ' ')"
            fi
        fi
        ;;
    *) WHY[$1]="no recipe for a peer named $1" ;;
    esac
}
for peer in $PEERS; do install_peer "$peer"; done

# --- the upstream ----------------------------------------------------------------------------
UP_PORT=$(free_port)
start_upstream() { # $@ = environment for it (BODIES=); sets UP_PID
    env "$@" python3 "$BENCH/peers_upstream.py" "$UP_PORT" 2>>"$WORK/upstream.log" &
    UP_PID=$!
    PIDS+=("$UP_PID")
    wait_up "http://127.0.0.1:$UP_PORT/" 10 || die "the upstream did not start: $(cat "$WORK/upstream.log")"
}
stop_upstream() { stop_pid "$UP_PID"; }

# --- starting each target ----------------------------------------------------------------------
# start_target NAME MODE (MODE: pass | WINDOW for a compaction run in a window of that many
# tokens). Sets PID, URL (its origin), CHAT_PATH, MODEL and HEADERS for wrk, MESSAGES_PATH for
# the sessions; returns 1 with WHY[NAME] set when it does not come up.
start_target() {
    local name=$1 mode=$2 port dir=$WORK/$1
    port=$(free_port)
    mkdir -p "$dir"
    URL=http://127.0.0.1:$port CHAT_PATH=/v1/chat/completions MESSAGES_PATH=/v1/messages
    MODEL=gpt-4o HEADERS="" PID=""
    local health=$URL/
    case $name in
    upstream)
        URL=http://127.0.0.1:$UP_PORT
        return 0
        ;;
    condenser)
        {
            printf '[server]\nlisten = "127.0.0.1:%s"\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n' "$port" "$UP_PORT"
            if [ "$mode" != pass ]; then
                # The settings the sessions were recorded with (tests/fixtures/sessions/README.md).
                printf '[context]\ntrigger_ratio = 0.8\ntarget_ratio = 0.5\nprecompute_ratio = 0.6\nkeep_recent_messages = 6\non_failure = "trim"\n'
                printf '[models."claude-sonnet-4-5-20250929"]\ncontext_window = %s\n' "$mode"
                printf '[models."claude-opus-5-5"]\ncontext_window = %s\n' "$mode"
            fi
        } >"$dir/condenser.toml"
        (cd "$dir" && RUST_LOG=warn exec "$BIN" --config "$dir/condenser.toml") >"$dir/out.log" 2>&1 &
        PID=$!
        health=$URL/healthz
        ;;
    litellm)
        {
            echo "model_list:"
            echo "  - model_name: gpt-4o"
            echo "    litellm_params: {model: openai/gpt-4o, api_base: 'http://127.0.0.1:$UP_PORT/v1', api_key: sk-bench}"
            for model in claude-sonnet-4-5-20250929 claude-opus-5-5; do
                echo "  - model_name: $model"
                echo "    litellm_params: {model: anthropic/$model, api_base: 'http://127.0.0.1:$UP_PORT', api_key: sk-bench}"
                [ "$mode" = pass ] || echo "    model_info: {max_input_tokens: $mode}"
            done
            echo "general_settings:"
            echo "  master_key: $BENCH_KEY"
            echo "litellm_settings:"
            echo "  telemetry: false"
            echo "  drop_params: true"
            if [ "$mode" != pass ]; then
                # LiteLLM's own context handling: requests checked against the model's window
                # before they are sent (a request over it is refused, not trimmed).
                echo "router_settings:"
                echo "  enable_pre_call_checks: true"
            fi
        } >"$dir/config.yaml"
        LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR DISABLE_SCHEMA_UPDATE=true \
            "$PEERS_DIR/litellm/bin/litellm" --config "$dir/config.yaml" --host 127.0.0.1 \
            --port "$port" --num_workers 1 >"$dir/out.log" 2>&1 &
        PID=$!
        health=$URL/health/liveliness
        ;;
    headroom | headroom-token)
        # Its defaults, but for the rate limit (60 requests a minute), which a load test
        # cannot pass; headroom-token is its mode that compresses most (prior turns rewritten).
        local mode_flag=()
        [ "$name" = headroom ] || mode_flag=(--mode token)
        HEADROOM_BEACON=off LITELLM_LOCAL_MODEL_COST_MAP=True \
            "$PEERS_DIR/headroom/bin/headroom" proxy --host 127.0.0.1 --port "$port" --no-rate-limit "${mode_flag[@]}" \
            --openai-api-url "http://127.0.0.1:$UP_PORT" --anthropic-api-url "http://127.0.0.1:$UP_PORT" \
            >"$dir/out.log" 2>&1 &
        PID=$!
        health=$URL/health
        ;;
    portkey)
        node "$PEERS_DIR/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" \
            --port="$port" --headless >"$dir/out.log" 2>&1 &
        PID=$!
        HEADERS="x-portkey-provider: openai|x-portkey-custom-host: http://127.0.0.1:$UP_PORT/v1"
        ;;
    tensorzero)
        cat >"$dir/tensorzero.toml" <<EOF
[gateway]
observability.enabled = false

[models.bench]
routing = ["upstream"]

[models.bench.providers.upstream]
type = "openai"
model_name = "gpt-4o"
api_base = "http://127.0.0.1:$UP_PORT/v1/"
api_key_location = "none"
EOF
        "$PEERS_DIR/tensorzero/bin/python" -c '
import sys, time, tensorzero
gateway = tensorzero._start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,
    postgres_url=None, valkey_url=None, async_setup=False)
print("listening", gateway.base_url, flush=True)
while True:
    time.sleep(3600)' "$dir/tensorzero.toml" >"$dir/out.log" 2>&1 &
        PID=$!
        for _ in $(seq 300); do grep -q '^listening ' "$dir/out.log" && break; sleep 0.1; done
        local base
        base=$(awk '/^listening / {print $2}' "$dir/out.log")
        URL=${base%/openai/v1} CHAT_PATH=/openai/v1/chat/completions MODEL=tensorzero::model_name::bench
        health=$URL/health
        ;;
    esac
    PIDS+=("$PID")
    if ! wait_up "$health" 240 "$PID"; then
        WHY[$name]="did not start: $(tail -3 "$dir/out.log" | tr '\n' ' ' | cut -c1-300)"
        stop_pid "$PID"
        return 1
    fi
}

rss_tree_kb() { # peak resident (VmHWM) of $1 and its descendants, kB
    local total=0 pid
    for pid in $1 $(pgrep -g "$1" 2>/dev/null | grep -vx "$1"); do
        total=$((total + $(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

to_ms() { # wrk latency such as 85.00us, 1.23ms, 1.01s -> milliseconds
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
        else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
        else { printf "%s", v } }'
}

# One wrk run; sets W_RPS, W_P50, W_P99, W_N (requests), W_BAD (errors and non-2xx).
RUN=0
run_wrk() { # $1 = connections, $2 = 1 for streamed, $3 = seconds
    RUN=$((RUN + 1))
    local out=$WORK/wrk.txt
    BENCH_PATH=$CHAT_PATH BENCH_MODEL=$MODEL BENCH_STREAM=$2 BENCH_RUN="$$-$RUN" BENCH_HEADERS=$HEADERS \
        wrk -t1 -c"$1" -d"${3}s" --timeout 10s --latency -s "$BENCH/peers_load.lua" "$URL$CHAT_PATH" >"$out" 2>&1 || true
    W_RPS=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
    W_P50=$(to_ms "$(awk '$1 == "50%" {print $2}' "$out")")
    W_P99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$out")")
    W_N=$(awk '/requests in/ {print $1}' "$out")
    W_BAD=$(awk '/Non-2xx or 3xx responses:/ {n += $NF} /Socket errors:/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} END {print n + 0}' "$out")
    : "${W_RPS:=0}" "${W_P50:=?}" "${W_P99:=?}" "${W_N:=0}"
}

answers_ok() { # $1 = 1 for streamed: one request by curl, a completion back
    local body
    body='{"model":"'$MODEL'",'$([ "$1" = 1 ] && echo '"stream":true,')'"messages":[{"role":"user","content":"sanity '$RANDOM'"}]}'
    local args=(-sS --max-time 30 -H 'content-type: application/json' -H "authorization: Bearer $BENCH_KEY")
    local pair
    IFS='|' read -ra pairs <<<"$HEADERS"
    for pair in "${pairs[@]}"; do args+=(-H "$pair"); done
    curl "${args[@]}" --data "$body" "$URL$CHAT_PATH" >"$WORK/answer.txt" 2>&1 || return 1
    if [ "$1" = 1 ]; then grep -q '"chat.completion.chunk"' "$WORK/answer.txt"; else grep -q '"chat.completion"' "$WORK/answer.txt"; fi
}

# --- 1. pass-through ---------------------------------------------------------------------------
declare -A R
TARGETS=(upstream condenser)
for peer in $PEERS; do [ -n "${WHY[$peer]:-}" ] || TARGETS+=("$peer"); done
[ "$PASS_THROUGH" = 1 ] || TARGETS=()
start_upstream
for name in "${TARGETS[@]}"; do
    log "pass-through: $name"
    start_target "$name" pass || { log "$name: ${WHY[$name]}"; continue; }
    served=0
    for stream in 0 1; do
        if ! answers_ok "$stream"; then
            R[$name,$stream,fail]="fails: $(head -c 200 "$WORK/answer.txt" | tr '\n' ' ')"
            log "$name ($([ "$stream" = 1 ] && echo streamed || echo whole)): ${R[$name,$stream,fail]}"
            continue
        fi
        run_wrk 8 "$stream" 2 # warm-up
        served=$((served + W_N))
        for c in 1 64; do
            run_wrk "$c" "$stream" "$DURATION"
            served=$((served + W_N))
            R[$name,$stream,$c,p50]=$W_P50 R[$name,$stream,$c,p99]=$W_P99 R[$name,$stream,$c,rps]=$W_RPS
            R[$name,$stream,$c,bad]=$W_BAD
            [ "$W_N" -gt 0 ] || R[$name,$stream,$c,none]=1
            log "$name stream=$stream c=$c: $W_RPS req/s, p50 $W_P50 ms, p99 $W_P99 ms, errors $W_BAD"
        done
    done
    # Top up to $REQUESTS before the peak is read, for at most $TOPUP seconds (a proxy serving
    # 20 requests a second would take eight minutes): the table says how many it served.
    topped=0
    while [ "$served" -lt "$REQUESTS" ] && [ "$topped" -lt "$TOPUP" ] && [ -z "${R[$name,0,fail]:-}" ]; do
        topped=$((topped + DURATION))
        run_wrk 64 0 "$DURATION"
        [ "$W_N" -gt 0 ] || break
        served=$((served + W_N))
    done
    R[$name,served]=$served
    [ -n "$PID" ] && R[$name,rss]=$(rss_tree_kb "$PID")
    [ -n "$PID" ] && stop_pid "$PID"
done
stop_upstream

added() { # $1 = target, $2 = stream, $3 = c, $4 = p50|p99: its latency minus the upstream's
    local v=${R[$1,$2,$3,$4]:-} u=${R[upstream,$2,$3,$4]:-}
    [ -z "${R[$1,$2,$3,none]:-}" ] || { echo "none answered in ${DURATION}s"; return; }
    [ -n "$v" ] && [ -n "$u" ] || { echo "-"; return; }
    awk -v v="$v" -v u="$u" 'BEGIN { printf "%+.3f", v - u }'
}

echo
echo "## Pass-through: latency added over the upstream alone (ms), requests/s at c=64, peak RSS"
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), load average at the end $(cut -d' ' -f1-3 /proc/loadavg); wrk -t1, ${DURATION}s a run, distinct bodies"
echo "condenser: $("$BIN" --version 2>/dev/null | head -1 || echo "$BIN"), its defaults (a small chat is under every trigger)"
for peer in $PEERS; do echo "$peer: ${VERSION[$peer]:-?}${WHY[$peer]:+ - NOT MEASURED: ${WHY[$peer]}}"; done
echo
printf '| %-10s | %-6s | %-17s | %-17s | %-9s | %s |\n' proxy body "c=1 p50 / p99" "c=64 p50 / p99" "c=64 req/s" "peak RSS (requests)"
printf '|%s|\n' "------------|--------|-------------------|-------------------|-----------|-----------------------"
for name in "${TARGETS[@]}"; do
    for stream in 0 1; do
        kind=$([ "$stream" = 1 ] && echo stream || echo whole)
        rss=$([ "$stream" = 0 ] && [ -n "${R[$name,rss]:-}" ] && awk -v k="${R[$name,rss]}" -v n="${R[$name,served]}" 'BEGIN { printf "%.1f MB (%d)", k / 1024, n }' || echo "")
        if [ -n "${R[$name,$stream,fail]:-}" ]; then
            printf '| %-10s | %-6s | %s | %s |\n' "$name" "$kind" "${R[$name,$stream,fail]}" "$rss"
        elif [ "$name" = upstream ]; then
            printf '| %-10s | %-6s | %-17s | %-17s | %-9s | %s |\n' "$name" "$kind" \
                "${R[$name,$stream,1,p50]} / ${R[$name,$stream,1,p99]}" "${R[$name,$stream,64,p50]} / ${R[$name,$stream,64,p99]}" \
                "${R[$name,$stream,64,rps]}" "(absolute)"
        elif [ -n "${WHY[$name]:-}" ]; then
            printf '| %-10s | %-6s | not measured: %s |\n' "$name" "$kind" "${WHY[$name]}"
        else
            errors=$((${R[$name,$stream,1,bad]:-0} + ${R[$name,$stream,64,bad]:-0}))
            printf '| %-10s | %-6s | %-17s | %-17s | %-9s | %s |\n' "$name" "$kind" \
                "$(added "$name" "$stream" 1 p50) / $(added "$name" "$stream" 1 p99)" \
                "$(added "$name" "$stream" 64 p50) / $(added "$name" "$stream" 64 p99)" \
                "${R[$name,$stream,64,rps]}$([ "$errors" = 0 ] || echo " ($errors errors)")" "$rss"
        fi
    done
done

[ "$COMPACTION" = 1 ] || exit 0

# --- 2. compaction on recorded sessions -------------------------------------------------------
# session file : window it was recorded in (tests/fixtures/sessions/README.md)
SESSIONS=(${SESSIONS:-claude-code-2.0.77.jsonl.zst:80000 claude-code-2.1.332.jsonl.zst:168000})
COMPACTING=(upstream condenser)
for peer in headroom litellm; do
    case " $PEERS " in *" $peer "*) [ -n "${WHY[$peer]:-}" ] || COMPACTING+=("$peer") ;; esac
done
case " ${COMPACTING[*]} " in *" headroom "*) COMPACTING+=(headroom-token) ;; esac
echo
echo "## Compaction: recorded sessions, one request at a time (pace ${PACE}s), billed with a prompt cache"
echo
echo "billed: input tokens with a read from the cache at 0.1 and a write at 1.25 (summarizer calls included); counted by condenser count"
echo
printf '| %-22s | %-10s | %-9s | %-13s | %-8s | %-14s | %-14s | %s |\n' session proxy requests "billed tokens" "vs sent" "over window" "added ms p50" "refused or failed"
printf '|%s|\n' "------------------------|------------|-----------|---------------|----------|----------------|----------------|------------------"
for entry in "${SESSIONS[@]}"; do
    session=${entry%%:*} window=${entry##*:}
    declare -A BASE=()
    for name in "${COMPACTING[@]}"; do
        log "compaction: $session through $name"
        run=$WORK/$name-$session
        mkdir -p "$run/bodies"
        start_upstream BODIES="$run/bodies"
        if ! start_target "$name" "$window"; then
            printf '| %-22s | %-10s | not measured: %s |\n' "${session%.jsonl.zst}" "$name" "${WHY[$name]}"
            stop_upstream
            continue
        fi
        python3 "$BENCH/peers_replay.py" send "$ROOT/tests/fixtures/sessions/$session" "$URL$MESSAGES_PATH" "$PACE" >"$run/sent.jsonl"
        [ -n "$PID" ] && stop_pid "$PID"
        # Background summaries still on their way are part of the bill; the upstream is stopped
        # once the proxy is.
        stop_upstream
        python3 "$BENCH/peers_replay.py" bill "$run/bodies" "$run/sent.jsonl" "$window" "$BIN" >"$run/bill.json"
        figures=$(python3 -c '
import json, sys
b = json.load(open(sys.argv[1]))
print(b["requests"], b["upstream_requests"], b["billed"], b["over_window"], b["invalid"], b["failed"], b["ms_p50"],
      (b["invalid_first"] + b["failed_first"] + [""])[0].replace(" ", "_")[:80])' "$run/bill.json")
        read -r requests upstream_requests billed over invalid failed p50 first <<<"$figures"
        [ "$name" = upstream ] && BASE[billed]=$billed BASE[p50]=$p50
        ratio=$(awk -v b="$billed" -v s="${BASE[billed]:-0}" 'BEGIN { if (s > 0) printf "%.2f", b / s; else print "-" }')
        add=$([ "$name" = upstream ] && echo "(${p50} abs.)" || awk -v p="$p50" -v u="${BASE[p50]:-0}" 'BEGIN { printf "%+.2f", p - u }')
        [ -z "${KEEP_DIR:-}" ] || { mkdir -p "$KEEP_DIR" && cp -r "$run" "$KEEP_DIR/"; }
        printf '| %-22s | %-10s | %-9s | %-13s | %-8s | %-14s | %-14s | %s |\n' "${session%.jsonl.zst}" "$name" \
            "$requests ($upstream_requests up)" "$billed" "$ratio" "$over of $upstream_requests" "$add" \
            "$((invalid + failed))$([ "$((invalid + failed))" = 0 ] || echo " (${first//_/ })")"
    done
done
