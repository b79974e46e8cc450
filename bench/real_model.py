"""Drives bench/real_model.sh: each recorded session, its facts planted, replayed through
condenser with a real summarizer, in front of bench/session_upstream.py; prints a row per
session and writes what the model wrote under OUT.

Usage: real_model.py BINARY SUMMARIZER_URL OUT SESSION_FILE...
Environment: ROUNDS (requests replayed per session, default 40), SUMMARY_TOKENS (the
summarizer's max_summary_tokens, default 512), SUMMARIZER_WINDOW (8192).
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import session_facts  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "40"))
SUMMARY_TOKENS = int(os.environ.get("SUMMARY_TOKENS", "512"))
SUMMARIZER_WINDOW = int(os.environ.get("SUMMARIZER_WINDOW", "8192"))
BATCHES = [b for b in (5, 10, 15, 20, 25, 30, 35, 50, 70, 90) if b < ROUNDS - 6]
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def wait_up(url):
    for _ in range(300):
        try:
            get(url)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def post(url, body, headers):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=3600) as response:
        response.read()
        return response.headers.get("x-condenser-action", "")


def series(metrics, name):
    """Every sample of metric `name`: {labels text: value}."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            found[labels[len(name):]] = float(value)
    return found


def run(path, binary, summarizer, results):
    name = os.path.basename(path).split(".jsonl")[0]
    session = session_facts.SESSIONS[name]
    model, window = session_facts.WINDOWS[name]
    out = os.path.join(results, name)
    os.makedirs(out, exist_ok=True)
    for stale in ("summaries.jsonl", "forwarded.json"):
        if os.path.exists(os.path.join(out, stale)):
            os.remove(os.path.join(out, stale))
    bodies = [session_facts.plant(b, BATCHES) for b in session_facts.load(path)[:ROUNDS]]
    up, port = free_port(), free_port()
    stub = subprocess.Popen([sys.executable, os.path.join(HERE, "session_upstream.py"), str(up), out, summarizer])
    config = os.path.join(out, "condenser.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:{port}"
[upstream]
base_url = "http://127.0.0.1:{up}"
[context]
keep_recent_messages = 6
[summarizer]
model = "smollm2"
base_url = "http://127.0.0.1:{up}/summarizer"
api = "chat"
via = "separate"
context_window = {SUMMARIZER_WINDOW}
max_summary_tokens = {SUMMARY_TOKENS}
timeout_secs = 1800
[recall]
enabled = true
[models."{model}"]
context_window = {window}
[models."smollm2"]
context_window = {SUMMARIZER_WINDOW}
""")
    log = open(os.path.join(out, "condenser.log"), "w")
    proxy = subprocess.Popen([binary, "--config", config, "--log-format", "json"], stderr=log,
                             env={**os.environ, "RUST_LOG": "info"})
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz")
        wait_up(f"http://127.0.0.1:{up}/")
        actions = []
        for at, body in enumerate(bodies):
            actions.append(post(f"http://127.0.0.1:{port}{session['path']}", body, dict([session["key"]])))
            # Let a summary started by this request land before the next, as an agent's turn
            # would let a fast summarizer's: the summaries are what is measured here.
            time.sleep(0.3)
            while json.loads(get(f"http://127.0.0.1:{up}/inflight"))["inflight"]:
                time.sleep(0.5)
            print(f"  {name} request {at + 1}/{len(bodies)}: {actions[-1] or 'forwarded'}", file=sys.stderr, flush=True)
        metrics = get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proxy.terminate()
        stub.terminate()
        proxy.wait()
        stub.wait()
    return name, actions, metrics, out


def report(name, actions, metrics, out):
    calls = []
    if os.path.exists(os.path.join(out, "summaries.jsonl")):
        calls = [json.loads(l) for l in open(os.path.join(out, "summaries.jsonl"))]
    made = sum(1 for l in open(os.path.join(out, "condenser.log")) if '"summary made"' in l)
    refused = {re.search(r'reason="([^"]+)"', k).group(1): int(v)
               for k, v in series(metrics, "condenser_summaries_total").items()
               if 'outcome="refused"' in k and v > 0}
    seconds = [c["seconds"] for c in calls]
    tokens = [c["reply"].get("usage", {}).get("completion_tokens", 0) for c in calls if isinstance(c["reply"], dict)]
    forwarded = json.load(open(os.path.join(out, "forwarded.json")))
    text = session_facts.texts(forwarded)
    wanted = session_facts.facts(BATCHES)
    kept = [answer for _, answer in wanted if answer in text]
    archived = "condenser_recall" in text
    # Recallable: kept, or in what the summary or a cut replaced, archived and named by the
    # references the forwarded request carries (every fact here lies in the summarized span).
    recallable = len(wanted) if archived else len(kept)
    row = {
        "session": name,
        "requests": len(actions),
        "summarized": actions.count("summarized"),
        "summary_steps": made,
        "summarizer_calls": len(calls),
        "refused": refused,
        "seconds_per_call": round(sum(seconds) / len(seconds), 1) if seconds else None,
        "summary_tokens_per_call": round(sum(tokens) / len(tokens)) if tokens else None,
        "facts": len(wanted),
        "kept": len(kept),
        "recallable": recallable,
        "kept_facts": kept,
    }
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(row, f, indent=1)
    return row


def main():
    binary, summarizer, results = sys.argv[1], sys.argv[2], sys.argv[3]
    rows = [report(*run(path, binary, summarizer, results)) for path in sys.argv[4:]]
    print("| session | requests | summary steps | calls | refused (why) | s per call | summary tokens | facts kept (recall off) | recallable (recall on) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        why = ", ".join(f"{k} {v}" for k, v in r["refused"].items()) or "none"
        print(f"| {r['session']} | {r['requests']} | {r['summary_steps']} | {r['summarizer_calls']} | "
              f"{sum(r['refused'].values())} ({why}) | {r['seconds_per_call']} | {r['summary_tokens_per_call']} | "
              f"{r['kept']}/{r['facts']} | {r['recallable']}/{r['facts']} |")


if __name__ == "__main__":
    main()
