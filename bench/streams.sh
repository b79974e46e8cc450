#!/usr/bin/env bash
# Peak memory with many SSE streams open at once: for each count (1k, 5k, 9k by default), a
# fresh condenser in front of an upstream that holds every stream open for HOLD seconds
# (bench/streams.py), COUNT streamed chat requests at once, then condenser's peak RSS
# (VmHWM), how many streams ended with [DONE] and how long they all took. Each stream holds
# a client descriptor in condenser, and with the plain upstream one upstream too, so 9k
# needs an open-files hard limit above 18k.
#
#   bash bench/streams.sh [BINARY] [COUNTS...]     # default: a `cargo build --release` binary
#
# UPSTREAM=h2 puts nginx between them speaking HTTP/2 over TLS as the hosted providers do
# (a CA and a localhost certificate made here, condenser trusting the CA through
# SSL_CERT_FILE), so a worker's streams share one upstream connection. H2_STREAMS is the
# streams nginx allows on one connection (SETTINGS_MAX_CONCURRENT_STREAMS; default 16384,
# above any count here); a provider-like 128 shows what condenser does past that limit.
set -euo pipefail
SCRIPT=streams
source "$(dirname "${BASH_SOURCE[0]}")/replay_common.sh"
shift || true
if [ $# -gt 0 ]; then COUNTS=("$@"); else COUNTS=(1000 5000 9000); fi
HOLD=${HOLD:-8}
UPSTREAM=${UPSTREAM:-http1}
H2_STREAMS=${H2_STREAMS:-16384}
case $UPSTREAM in http1 | h2) ;; *) echo "UPSTREAM is http1 or h2, not $UPSTREAM" >&2; exit 1 ;; esac

if [ "$UPSTREAM" = h2 ]; then
    NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
    # rustls wants a CA marked as one and a leaf naming localhost in its subjectAltName.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=condenser-bench-ca -keyout "$WORK/ca.key" -out "$WORK/ca.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
        -keyout "$WORK/localhost.key" -out "$WORK/localhost.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
        >"$WORK/leaf.ext"
    openssl x509 -req -in "$WORK/localhost.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
        -set_serial 2 -days 2 -extfile "$WORK/leaf.ext" -out "$WORK/localhost.pem" 2>/dev/null
fi

# nginx on $1: TLS and HTTP/2 to condenser, HTTP/1.1 to the Python upstream on $2, each
# event passed on as it comes. One worker, holding an nginx connection to $2 per stream.
start_nginx() {
    mkdir -p "$WORK/nginx"
    cat >"$WORK/nginx/nginx.conf" <<NGINX
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 20000; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    http2_max_concurrent_streams $H2_STREAMS;
    server {
        listen 127.0.0.1:$1 ssl http2;
        ssl_certificate $WORK/localhost.pem;
        ssl_certificate_key $WORK/localhost.key;
        location / {
            proxy_pass http://127.0.0.1:$2;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 600s;
        }
    }
}
NGINX
    "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" & nginx_pid=$!
    PIDS+=("$nginx_pid")
    for _ in $(seq 100); do
        curl -s -o /dev/null --cacert "$WORK/ca.pem" "https://localhost:$1/" && return 0
        sleep 0.1
    done
    echo "nginx did not start: $(cat "$WORK/nginx/error.log")" >&2
    exit 1
}

printf '%-7s %-9s %-12s %-9s %s\n' streams complete "peak RSS MB" seconds others
for count in "${COUNTS[@]}"; do
    UP=$(free_port)
    PORT=$(free_port)
    python3 "$ROOT/bench/streams.py" upstream "$UP" "$HOLD" & up_pid=$!
    PIDS+=("$up_pid")
    base_url="http://127.0.0.1:$UP"
    nginx_pid=
    if [ "$UPSTREAM" = h2 ]; then
        TLS=$(free_port)
        start_nginx "$TLS" "$UP"
        base_url="https://localhost:$TLS"
    fi
    cat >"$WORK/condenser.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[upstream]
base_url = "$base_url"
TOML
    SSL_CERT_FILE=$([ "$UPSTREAM" = h2 ] && echo "$WORK/ca.pem" || true) RUST_LOG=warn \
        "$BIN" --config "$WORK/condenser.toml" 2>"$WORK/condenser.log" & pid=$!
    PIDS+=("$pid")
    wait_up "http://127.0.0.1:$PORT/healthz"
    start=$(date +%s%N)
    result=$(python3 "$ROOT/bench/streams.py" clients "$PORT" "$count")
    nanos=$(($(date +%s%N) - start))
    peak=$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status")
    python3 - "$result" "$peak" "$nanos" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"{r['streams']:<7} {r['complete']:<9} {sys.argv[2]:<12} {int(sys.argv[3]) / 1e9:<9.1f} {r['others'] or ''}")
PY
    kill "$pid" "$up_pid" $nginx_pid 2>/dev/null || true
    wait "$pid" "$up_pid" $nginx_pid 2>/dev/null || true
done
