# What bench/load.sh and scripts/pgo-build.sh share: tools, a temp dir cleaned on exit, free
# ports, the canned nginx upstream and the wrk request mix. Sourced, not run; the caller sets
# SCRIPT (its name, for messages) and `set -euo pipefail`.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { echo "$SCRIPT: $*" >&2; }
die() { log "$*"; exit 1; }

# --- tools -------------------------------------------------------------------------------
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    [ "$(id -u)" = 0 ] || die "nginx and wrk are needed: apt-get install -y nginx wrk"
    log "installing nginx and wrk"
    apt-get update -qq >/dev/null
    # policy-rc.d in containers keeps the packaged nginx service from starting.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx wrk >/dev/null
fi
NGINX=$(command -v nginx)
for tool in curl wrk awk; do command -v "$tool" >/dev/null || die "$tool not found"; done

# --- temp dir, processes, clean-up -------------------------------------------------------
WORK=$(mktemp -d "/tmp/condenser-$SCRIPT.XXXXXX")
PIDS=()
stop_pid() { # $1 = pid: TERM, up to 5 s to exit, then KILL
    kill "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

USED_PORTS=" "
free_port() {
    local port
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 40000))
        case $USED_PORTS in *" $port "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            USED_PORTS="$USED_PORTS$port "
            echo "$port"
            return 0
        fi
    done
    return 1
}

wait_up() { # $1 = url
    for _ in $(seq 100); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.1
    done
    return 1
}

# --- the upstream: nginx answering with a canned chat.completion ---------------------------
COMPLETION='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Sure. The deployment looks healthy: latency is within budget and no errors were logged.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":18,"total_tokens":138},"system_fingerprint":"fp_bench"}'
# The same answer streamed, for requests under /sse/: a few deltas, then usage, then [DONE].
# nginx turns the \n escapes into line ends.
STREAM=''
for delta in 'Sure.' ' The deployment' ' looks healthy.'; do
    STREAM+='data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"'"$delta"'"},"finish_reason":null}],"usage":null}\n\n'
done
STREAM+='data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":18,"total_tokens":138}}\n\ndata: [DONE]\n\n'

nginx_common() { # $1 = prefix dir
    cat <<EOF
worker_processes auto;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
EOF
}

start_upstream() { # $1 = port; sets UP_PID
    mkdir -p "$WORK/upstream"
    {
        nginx_common "$WORK/upstream"
        cat <<EOF
    server {
        listen 127.0.0.1:$1;
        location /sse/v1/ {
            if (\$request_method != POST) { return 405; }
            default_type text/event-stream;
            return 200 '$STREAM';
        }
        # Any POST under /v1/, so condenser's pass-through path can be measured as well.
        location /v1/ {
            if (\$request_method != POST) { return 405; }
            default_type application/json;
            return 200 '$COMPLETION';
        }
        location / { return 404; }
    }
}
EOF
    } >"$WORK/upstream/nginx.conf"
    "$NGINX" -p "$WORK/upstream" -c "$WORK/upstream/nginx.conf" -e "$WORK/upstream/error.log" &
    UP_PID=$!
    PIDS+=("$UP_PID")
    wait_up "http://127.0.0.1:$1/" || die "upstream nginx did not start: $(cat "$WORK/upstream/error.log")"
}

# A config for condenser on $1 in front of the upstream on $2.
condenser_config() {
    cat <<EOF
[server]
listen = "127.0.0.1:$1"

[upstream]
base_url = "http://127.0.0.1:$2"
EOF
}

# --- the request mix: under-threshold conversations of 1 to 20 messages, round-robin ------
# In wrk's environment: BENCH_PATH (default /v1/chat/completions), MIX_MODEL (default gpt-4o),
# MIX_STREAM=1 to ask for streamed answers.
cat >"$WORK/mix.lua" <<'EOF'
local words = {"the", "deployment", "latency", "is", "within", "budget", "and", "we", "should",
  "check", "the", "logs", "for", "errors", "before", "the", "release", "of", "version", "two",
  "please", "summarize", "what", "changed", "in", "the", "config", "since", "last", "week"}
local seed = 7
local function word()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return words[seed % #words + 1]
end
local function sentence(n)
  local out = {}
  for i = 1, n do out[i] = word() end
  return table.concat(out, " ")
end
local stream = os.getenv("MIX_STREAM") == "1" and '"stream":true,' or ''
local model = os.getenv("MIX_MODEL") or "gpt-4o"
local bodies = {}
for _, n in ipairs({1, 2, 4, 7, 10, 14, 20}) do
  local messages = {'{"role":"system","content":"You are a helpful assistant."}'}
  for i = 1, n - 1 do
    local role = (i % 2 == 1) and "user" or "assistant"
    messages[#messages + 1] = '{"role":"' .. role .. '","content":"' .. sentence(10 + (i * 7) % 40) .. '"}'
  end
  bodies[#bodies + 1] = '{"model":"' .. model .. '",' .. stream .. '"max_tokens":256,"messages":[' .. table.concat(messages, ",") .. ']}'
end
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer sk-bench"}
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
local next_body = 0
request = function()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", path, headers, bodies[next_body])
end
EOF
