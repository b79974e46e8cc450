#!/usr/bin/env bash
# The extra latency of one recall round, condenser's share alone (issue 22). A release build
# in front of a scripted upstream (bench/recall_upstream.py) that answers at once: the
# summarizer with a short summary; the model, when condenser_recall is offered, by calling it
# (`refs`: four of the references the summary names; `query`: a search) or never (`none`),
# and by text once the call is answered. For each API, whole and streamed, the same compacted
# request (`x-condenser-mode: force`, the summary cached by a first request left out) is sent
# N times in each mode, the modes interleaved, one request at a time over a kept-alive
# connection. Bodies: a chat of 40 messages of about 100 tokens (all three APIs), and an agent
# session of 200 tool rounds (about 700 KB; Messages and Responses, bench/agent_bodies.py).
# Prints, in ms, p50 / p95 of the client's end-to-end time per mode; the extra round
# (mode − none); the upstream's own time for the continuation (head read to reply written,
# which it measures itself); condenser's share = extra p50 − that; and the same share taken
# request by request (end-to-end less all upstream time, mode − none, at p50).
#
#   bash bench/recall_round.sh [BINARY]      # default: a `cargo build --release --locked` binary
#   N=200 (requests per mode and case), ONLY=chat40+th (one body alone)
set -euo pipefail
SCRIPT=recall-round
source "$(dirname "${BASH_SOURCE[0]}")/replay_common.sh"

python3 "$ROOT/bench/agent_bodies.py" "$WORK" messages claude-bench 200 200
python3 "$ROOT/bench/agent_bodies.py" "$WORK" responses gpt-bench 200 200
UP=$(free_port)
PORT=$(free_port)
python3 "$ROOT/bench/recall_upstream.py" "$UP" & PIDS+=("$!")
cat >"$WORK/condenser.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[upstream]
base_url = "http://127.0.0.1:$UP"
[models."gpt-bench"]
context_window = 400000
encoding = "o200k_base"
[models."claude-bench"]
context_window = 400000
encoding = "o200k_base"
TOML
RUST_LOG=info "$BIN" --config "$WORK/condenser.toml" --log-format json 2>"$WORK/condenser.log" & PIDS+=("$!")
wait_up "http://127.0.0.1:$PORT/healthz"
wait_up "http://127.0.0.1:$UP/stats"
echo "binary: $BIN ($(git -C "$ROOT" rev-parse --short HEAD)), N=${N:-200}, load: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$PORT" "$UP" "$WORK" "${N:-200}" <<'PY'
import http.client, json, os, random, statistics, sys, time
port, up, work, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
MODES = ("none", "refs", "query")
rng = random.Random(7)
WORDS = ("service port deploy build cache region token parser module queue worker retry "
         "timeout config schema index shard replica lease ticket budget review merge").split()
turn = lambda i: f"msg-{i}. " + " ".join(rng.choice(WORDS) for _ in range(95))
chat = [{"role": ("user", "assistant")[i % 2], "content": turn(i)} for i in range(40)]
chat.append({"role": "user", "content": "Which port does the service bind to?"})
system = "You are a careful assistant for the Falcon project."
bodies = {
    ("chat40", "chat/completions"): {"model": "gpt-bench", "messages": [{"role": "system", "content": system}] + chat},
    ("chat40", "responses"): {"model": "gpt-bench", "instructions": system, "input": chat},
    ("chat40", "messages"): {"model": "claude-bench", "max_tokens": 500, "system": system, "messages": chat},
    ("agent200", "messages"): json.load(open(f"{work}/messages-0200.json")),
    ("agent200", "responses"): json.load(open(f"{work}/responses-0200.json")),
    # Adaptive thinking, as the current Claude Code asks on every request: each reply opens
    # with signed thinking, which a continuation must carry back.
    ("chat40+th", "messages"): {"model": "claude-bench", "max_tokens": 2000, "system": system, "messages": chat,
                                "thinking": {"type": "adaptive"}},
}
# ONLY=chat40+th (a body's name) measures that body alone.
if os.environ.get("ONLY"):
    bodies = {key: body for key, body in bodies.items() if key[0] == os.environ["ONLY"]}
conn = http.client.HTTPConnection("127.0.0.1", port)
upstream = http.client.HTTPConnection("127.0.0.1", up)
log = open(f"{work}/condenser.log")
seq = 0

def send(path, data, mode, stream):
    global seq
    seq += 1
    headers = {"content-type": "application/json", "x-condenser-mode": "force", "x-api-key": "sk-bench",
               "authorization": "Bearer sk-bench", "x-bench-recall": mode, "x-bench-id": str(seq)}
    t0 = time.perf_counter()
    conn.request("POST", f"/v1/{path}", data, headers)
    r = conn.getresponse()
    text = r.read().decode()
    ms = (time.perf_counter() - t0) * 1e3
    h = lambda k: r.getheader(k, "")
    assert r.status == 200 and h("x-condenser-action") == "summarized", (r.status, dict(r.getheaders()), text[:300])
    want = "A plain answer." if mode == "none" else "Recalled:"
    assert want in text and "condenser_recall" not in text, (mode, text[:500])
    assert stream or h("x-condenser-recalls") == ("" if mode == "none" else "1"), dict(r.getheaders())
    return str(seq), ms, h("x-condenser-cache")

def stats():
    upstream.request("GET", "/stats")
    by_id = {}
    for line in upstream.getresponse().read().decode().splitlines():
        s = json.loads(line)
        by_id.setdefault(s["id"], []).append((s["kind"], s["ms"]))
    return by_id

pct = lambda xs, q: sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]
print(f"{'body':<9} {'api':<17} {'stream':<6} {'mode':<5} {'p50':>6} {'p95':>6} {'extra p50':>9} {'extra p95':>9}"
      f" {'upstream cont.':>14} {'share':>6} {'share/req':>9} {'overhead_ms':>11}")
for (size, path), body in bodies.items():
    for stream in (False, True):
        data = json.dumps(dict(body, stream=True) if stream else body).encode()
        for mode in MODES * 3:  # the summary made, then warm-up; left out
            send(path, data, mode, stream)
        stats(); log.read()
        runs = {m: [] for m in MODES}
        for i in range(n):
            for mode in MODES:
                runs[mode].append(send(path, data, mode, stream))
        time.sleep(0.2)
        by_id = stats()
        lines = [json.loads(l) for l in log.read().splitlines() if '"overhead_ms"' in l]
        lines = [l["overhead_ms"] for l in lines if l.get("path") == f"/v1/{path}"]
        assert len(lines) == 3 * n, (len(lines), 3 * n)
        overhead = {m: lines[k::3] for k, m in enumerate(MODES)}
        rest = {}  # end to end less every upstream request's own time
        for mode, rows in runs.items():
            assert all(cache == "hit" for _, _, cache in rows), "the summary was not on hand"
            kinds = [tuple(k for k, _ in by_id[i]) for i, _, _ in rows]
            assert set(kinds) == {("text",) if mode == "none" else ("call", "continuation")}, set(kinds)
            rest[mode] = [ms - sum(t for _, t in by_id[i]) for i, ms, _ in rows]
        base = [ms for _, ms, _ in runs["none"]]
        for mode in MODES:
            e2e = [ms for _, ms, _ in runs[mode]]
            cols = f"{pct(e2e, .5):>6.2f} {pct(e2e, .95):>6.2f}"
            if mode != "none":
                cont = pct([t for i, _, _ in runs[mode] for k, t in by_id[i] if k == "continuation"], .5)
                extra = pct(e2e, .5) - pct(base, .5)
                cols += (f" {extra:>9.2f} {pct(e2e, .95) - pct(base, .95):>9.2f} {cont:>14.2f} {extra - cont:>6.2f}"
                         f" {pct(rest[mode], .5) - pct(rest['none'], .5):>9.2f}")
            else:
                cols += " " * 60
            print(f"{size:<9} {path:<17} {str(stream).lower():<6} {mode:<5} {cols} {pct(overhead[mode], .5):>11.2f}", flush=True)
PY
