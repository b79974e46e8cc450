#!/usr/bin/env bash
# Gateway speed: condenser against a plain nginx reverse proxy, both in front of the same
# canned upstream (nginx answering POST /v1/chat/completions with a fixed body), driven by
# wrk with one request mix. Everything runs on 127.0.0.1 in a temp dir and is stopped on exit.
#
#   bash bench/load.sh
#
# Environment:
#   CONDENSER_BIN   use this binary instead of building one
#   PGO             1 (default): build with scripts/pgo-build.sh, as releases are built;
#                   0: a plain `cargo build --release` (both honour CARGO_TARGET_DIR)
#   DURATION        seconds per measured wrk run (default 5)
#   ROUNDS          rounds over all targets; the report shows medians (default 5)
#   WARMUP          seconds of warm-up per target (default 2)
#   CONNECTIONS     connections of the throughput run (default 32)
#   RUST_LOG        condenser's log filter (default warn; info logs one line per request)
set -euo pipefail
SCRIPT=load
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-5}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-32}
export RUST_LOG=${RUST_LOG:-warn}

# --- condenser binary ----------------------------------------------------------------------
if [ -n "${CONDENSER_BIN:-}" ]; then
    BIN=$(realpath "$CONDENSER_BIN")
    BUILD="given ($BIN)"
elif [ "${PGO:-1}" = 1 ]; then
    log "building condenser with PGO (scripts/pgo-build.sh, a few minutes)"
    BIN=$(bash "$ROOT/scripts/pgo-build.sh" | tail -1) ||
        die "the PGO build failed (above); PGO=0 measures a plain release build"
    BUILD="release with PGO (scripts/pgo-build.sh)"
else
    log "building condenser (release)"
    (cd "$ROOT" && cargo build --release --quiet --bin condenser)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/condenser
    BUILD="release without PGO"
fi
[ -x "$BIN" ] || die "no condenser binary at $BIN"

UP_PORT=$(free_port)
PROXY_PORT=$(free_port)
CONDENSER_PORT=$(free_port)
start_upstream "$UP_PORT"

# --- nginx #2, a plain reverse proxy with a keep-alive pool ---------------------------------
mkdir -p "$WORK/proxy"
{
    nginx_common "$WORK/proxy"
    cat <<EOF
    upstream backend {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$PROXY_PORT;
        client_max_body_size 32m;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
} >"$WORK/proxy/nginx.conf"

# --- condenser ------------------------------------------------------------------------------
condenser_config "$CONDENSER_PORT" "$UP_PORT" >"$WORK/condenser.toml"

"$NGINX" -p "$WORK/proxy" -c "$WORK/proxy/nginx.conf" -e "$WORK/proxy/error.log" &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
(cd "$WORK" && exec "$BIN" --config "$WORK/condenser.toml") 2>"$WORK/condenser.log" &
CONDENSER_PID=$!
PIDS+=("$CONDENSER_PID")

wait_up "http://127.0.0.1:$PROXY_PORT/" || die "proxy nginx did not start: $(cat "$WORK/proxy/error.log")"
wait_up "http://127.0.0.1:$CONDENSER_PORT/healthz" || die "condenser did not start: $(cat "$WORK/condenser.log")"

# --- sanity: each target answers 200 with the completion; condenser says it forwarded ------
BODY='{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Is the deployment healthy?"}]}'
for port in "$UP_PORT" "$PROXY_PORT" "$CONDENSER_PORT"; do
    status=$(curl -sS -o "$WORK/answer.json" -D "$WORK/answer.headers" -w '%{http_code}' \
        -H 'Content-Type: application/json' -H 'Authorization: Bearer sk-bench' \
        --data "$BODY" "http://127.0.0.1:$port/v1/chat/completions")
    [ "$status" = 200 ] || die "127.0.0.1:$port answered $status: $(cat "$WORK/answer.json")"
    grep -q '"object":"chat.completion"' "$WORK/answer.json" ||
        die "127.0.0.1:$port: unexpected body: $(cat "$WORK/answer.json")"
done
grep -qi '^x-condenser-action: forwarded' "$WORK/answer.headers" ||
    die "condenser did not answer x-condenser-action: forwarded: $(cat "$WORK/answer.headers")"
if cmp -s <(printf '%s' "$COMPLETION") "$WORK/answer.json"; then
    log "sanity check passed: condenser forwarded, body byte for byte; $(grep -i '^x-condenser-prompt-tokens' "$WORK/answer.headers" | tr -d '\r')"
else
    log "WARNING: condenser's body differs from upstream's: $(cat "$WORK/answer.json")"
fi
status=$(curl -sS -o "$WORK/answer.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data "$BODY" "http://127.0.0.1:$CONDENSER_PORT/v1/embeddings")
[ "$status" = 200 ] && cmp -s <(printf '%s' "$COMPLETION") "$WORK/answer.json" ||
    die "condenser's pass-through answered $status: $(cat "$WORK/answer.json")"

# --- runs -----------------------------------------------------------------------------------
declare -A RPS P50 P99 ERRS ALL_RPS
to_ms() { # wrk latency such as 85.00us, 1.23ms, 1.01s -> milliseconds
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
        else if (v ~ /m$/) { sub(/m$/, "", v); printf "%.3f", v * 60000 }
        else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
        else { printf "%s", v } }'
}
# Each figure is appended per round ("a b c"); the report shows the median.
run_wrk() { # $1 = name, $2 = port, $3 = connections, $4 = shape, $5 = round; BENCH_PATH set
    local out="$WORK/wrk-$1-$4-$5.txt"
    wrk -t1 -c"$3" -d"${DURATION}s" --timeout 5s --latency -s "$WORK/mix.lua" \
        "http://127.0.0.1:$2$BENCH_PATH" >"$out"
    RPS[$1,$4]+="$(awk '/^Requests\/sec:/ {print $2}' "$out") "
    P50[$1,$4]+="$(to_ms "$(awk '$1 == "50%" {print $2}' "$out")") "
    P99[$1,$4]+="$(to_ms "$(awk '$1 == "99%" {print $2}' "$out")") "
    local bad
    bad=$(awk '/Non-2xx or 3xx responses:/ {n += $NF} /Socket errors:/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} END {print n + 0}' "$out")
    ERRS[$1,$4]=$((${ERRS[$1,$4]:-0} + bad))
    [ "$bad" = 0 ] || log "$1 ($4): $bad errors or non-2xx responses: $(grep -E 'Non-2xx|Socket errors' "$out" | tr '\n' ' ')"
}
median() { # of the space-separated numbers in $1
    tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {
        if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2];
        else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# name:port:path. The last row sends the same bodies to a path condenser passes through
# without parsing (/v1/embeddings), which separates the HTTP relay from the chat handling.
TARGETS=(
    "direct:$UP_PORT:/v1/chat/completions"
    "nginx-proxy:$PROXY_PORT:/v1/chat/completions"
    "condenser:$CONDENSER_PORT:/v1/chat/completions"
    "cond-passthru:$CONDENSER_PORT:/v1/embeddings"
)
for target in "${TARGETS[@]}"; do
    IFS=: read -r name port BENCH_PATH <<<"$target"
    export BENCH_PATH
    log "$name ($BENCH_PATH): warm-up ${WARMUP}s"
    wrk -t1 -c"$CONNECTIONS" -d"${WARMUP}s" -s "$WORK/mix.lua" \
        "http://127.0.0.1:$port$BENCH_PATH" >/dev/null
done
# Rounds interleave the targets, so a noisy moment of a shared machine hits them alike.
for round in $(seq "$ROUNDS"); do
    log "round $round/$ROUNDS: every target at c=$CONNECTIONS and c=1, ${DURATION}s each"
    for target in "${TARGETS[@]}"; do
        IFS=: read -r name port BENCH_PATH <<<"$target"
        export BENCH_PATH
        run_wrk "$name" "$port" "$CONNECTIONS" throughput "$round"
        run_wrk "$name" "$port" 1 latency "$round"
    done
done
for key in "${!RPS[@]}"; do
    ALL_RPS[$key]=${RPS[$key]}
    RPS[$key]=$(median "${RPS[$key]}")
    P50[$key]=$(median "${P50[$key]}")
    P99[$key]=$(median "${P99[$key]}")
done

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
tree_rss_kb() { # a process and its children (nginx master and workers)
    local total pid
    total=$(rss_kb "$1")
    for pid in $(pgrep -P "$1"); do total=$((total + $(rss_kb "$pid"))); done
    echo "$total"
}
CONDENSER_RSS=$(rss_kb "$CONDENSER_PID")
PROXY_RSS=$(tree_rss_kb "$PROXY_PID")
kill -0 "$CONDENSER_PID" 2>/dev/null || die "condenser exited during the run: $(tail -5 "$WORK/condenser.log")"
WARNINGS=$(grep -ciE 'warn|error' "$WORK/condenser.log" || true)

# --- report ---------------------------------------------------------------------------------
echo
echo "condenser build: $BUILD"
echo "condenser load benchmark: $(nproc) cores, wrk -t1, median of $ROUNDS rounds of ${DURATION}s per figure, RUST_LOG=$RUST_LOG"
echo "upstream: nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), canned chat.completion; mix: 7 conversations of 1-20 messages"
echo "cond-passthru: the same bodies to condenser's /v1/embeddings, relayed without parsing"
echo
printf '%-13s | %12s %9s %9s | %10s %9s %9s | %s\n' \
    target "c=$CONNECTIONS req/s" "p50 ms" "p99 ms" "c=1 req/s" "p50 ms" "p99 ms" errors
printf -- '--------------+--------------------------------+--------------------------------+-------\n'
for target in "${TARGETS[@]}"; do
    name=${target%%:*}
    printf '%-13s | %12s %9s %9s | %10s %9s %9s | %s\n' "$name" \
        "${RPS[$name,throughput]}" "${P50[$name,throughput]}" "${P99[$name,throughput]}" \
        "${RPS[$name,latency]}" "${P50[$name,latency]}" "${P99[$name,latency]}" \
        "$((ERRS[$name,throughput] + ERRS[$name,latency]))"
done
echo
awk -v cp="${P50[cond-passthru,latency]}" -v cprps="${RPS[cond-passthru,throughput]}" \
    -v cd="${P50[condenser,latency]}" -v nx="${P50[nginx-proxy,latency]}" -v di="${P50[direct,latency]}" \
    -v crps="${RPS[condenser,throughput]}" -v nrps="${RPS[nginx-proxy,throughput]}" 'BEGIN {
    printf "added p50 at c=1 over direct: condenser %+.3f ms, nginx-proxy %+.3f ms (condenser pass-through %+.3f ms)\n", cd - di, nx - di, cp - di
    printf "throughput ratio condenser / nginx-proxy at c=%s: %.2f (condenser pass-through: %.2f)\n", "'"$CONNECTIONS"'", crps / nrps, cprps / nrps
    printf "bars: throughput >= nginx-proxy: %s; added p50 <= nginx-proxy'"'"'s: %s\n",
        (crps >= nrps ? "met" : "NOT met"), ((cd - di) <= (nx - di) ? "met" : "NOT met")
}'
echo "RSS after the runs: condenser $((CONDENSER_RSS / 1024)) MiB (${CONDENSER_RSS} kB); nginx-proxy master+workers $((PROXY_RSS / 1024)) MiB"
echo "condenser log lines mentioning warn/error: $WARNINGS"
echo "c=$CONNECTIONS req/s per round:"
for target in "${TARGETS[@]}"; do
    name=${target%%:*}
    echo "  $name: ${ALL_RPS[$name,throughput]}"
done
