"""The compaction rows of bench/peers.sh: a recorded agent session sent through a proxy, and
what its upstream (bench/peers_upstream.py with BODIES set) received of it, judged and billed.

  peers_replay.py send SESSION.jsonl.zst URL [PACE]   one line of JSON per request: its time
                                                     and status, sent in order, one at a time
  peers_replay.py bill BODIES SENT WINDOW [CONDENSER] one line of JSON: the run's figures

Each request the upstream received (the summarizer's calls too) is billed as Anthropic bills a
prompt cache: a token read from the cache at 0.1 of an input token, a token written to it at
1.25. What is read is the longest prefix the request shares with one of the 8 before it (a
provider keeps a cached prefix for minutes and a run lasts less, so a summarizer's call in
between does not evict the conversation's), measured on the prompt as the model reads it:
tools, system, messages, in that order, `cache_control` marks left out (moving a mark does not
change what is cached). Claude Code marks its last message for caching, so what a request
does not read it writes. A request's tokens are counted by `condenser count` when a binary is
given (the same counter for every proxy; the prefix's share of them by its share of the
prompt's characters), else as characters / 4.

A request the model would refuse: its tool results must each answer a call of the assistant
message just before, and each call must be answered in the next user message.
"""

import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse


def send(session, url, pace):
    target = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
    lines = subprocess.run(["zstd", "-dc", session], check=True, capture_output=True).stdout.splitlines()
    for n, line in enumerate(lines, 1):
        headers = {"content-type": "application/json", "x-api-key": os.environ.get("BENCH_KEY", "sk-bench"),
                   "anthropic-version": "2023-06-01"}
        start = time.perf_counter()
        try:
            connection.request("POST", target.path, body=line, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
            answer, status = str(e).encode(), 0
        elapsed = time.perf_counter() - start
        print(json.dumps({"n": n, "ms": round(elapsed * 1000, 3), "status": status,
                          "error": None if status == 200 else answer[:300].decode("utf-8", "replace")}),
              flush=True)
        if pace:
            time.sleep(pace)


def without_marks(value):
    if isinstance(value, dict):
        return {k: without_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_marks(v) for v in value]
    return value


def prompt_text(body):
    return json.dumps([without_marks(body.get(k)) for k in ("tools", "system", "messages")],
                      ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def common_prefix(a, b):
    """The length of the longest common prefix: 64 KiB blocks compared whole (in C) until one
    differs, then that block by halves."""
    end, at, block = min(len(a), len(b)), 0, 1 << 16
    while at + block <= end and a[at:at + block] == b[at:at + block]:
        at += block
    lo, hi = at, min(at + block, end)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[at:mid] == b[at:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def refused(body):
    """Why the model would refuse this Messages body, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no messages"
    if messages[0].get("role") != "user":
        return "the first message is not the user's"
    calls = set()
    for i, m in enumerate(messages):
        blocks = m.get("content") if isinstance(m.get("content"), list) else []
        if m.get("role") == "assistant":
            if calls:
                return f"message {i}: calls {sorted(calls)[:2]} not answered in the next user message"
            calls = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
        else:
            answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
            if answered - calls:
                return f"message {i}: results {sorted(answered - calls)[:2]} answer no call just before"
            if calls - answered and i + 1 < len(messages):
                return f"message {i}: calls {sorted(calls - answered)[:2]} left unanswered"
            calls = set()
    return None


def tokens(body_path, condenser):
    if not condenser:
        return None
    out = subprocess.run([condenser, "count", "--api", "messages", "--json", body_path],
                         capture_output=True, text=True)
    try:
        return json.loads(out.stdout).get("prompt_tokens") if out.returncode == 0 else None
    except ValueError:
        return None


def bill(bodies, sent, window, condenser):
    sent_rows = [json.loads(line) for line in open(sent)]
    billed = prompt = over = 0
    invalid, seen, counted_by = [], [], set()
    names = sorted(os.listdir(bodies))
    for n, name in enumerate(names, 1):
        path = os.path.join(bodies, name)
        try:
            body = json.load(open(path, "rb"))
            why, text = refused(body), prompt_text(body)
        except (ValueError, AttributeError) as e:
            why, text = f"not a Messages body: {e}", ""
        cached_chars = max((common_prefix(text, earlier) for earlier in seen), default=0)
        seen = (seen + [text])[-8:]
        counted = tokens(path, condenser)
        counted_by.add("condenser count" if counted is not None else "characters / 4")
        total = counted if counted is not None else len(text) / 4
        cached = total * cached_chars / max(1, len(text))
        billed += 0.1 * cached + 1.25 * (total - cached)
        prompt += total
        over += total > window
        if why:
            invalid.append(f"{n}: {why}")
    failed = [r for r in sent_rows if r["status"] != 200]
    times = [r["ms"] for r in sent_rows]
    print(json.dumps({
        "requests": len(sent_rows), "upstream_requests": len(names),
        "prompt_tokens": round(prompt), "billed": round(billed),
        "over_window": over, "invalid": len(invalid), "invalid_first": invalid[:3],
        "failed": len(failed), "failed_first": [f'{r["n"]}: {r["status"]} {r["error"]}' for r in failed[:3]],
        "ms_p50": statistics.median(times) if times else None,
        "ms_mean": statistics.fmean(times) if times else None,
        "counted_by": sorted(counted_by)}))


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
    else:
        bill(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
