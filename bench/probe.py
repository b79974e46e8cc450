#!/usr/bin/env python3
"""The probe score of compaction against any OpenAI-compatible model (issue 56): what a model can
still answer of a recorded agent session once condenser has compacted it, beside what it
answers with the session sent whole. Exact answers, no judge model.

The facts: the task's id (KX-7731-QZ), the release build an early file read shows (4f9c2ab1),
and a checksum planted in the tool output of some batches (bench/session_facts.py). The session
is turned into chat completions (tool calls and their results kept as chat's) and cut at
ROUNDS requests. Each question is asked twice:
  whole      the session's conversation at that request, and the question, sent to the model;
  forwarded  the same, through condenser: every earlier request of the session went through it
             first (each summary made by the model itself, or --summarizer-*), so that the
             question's request is compacted as that session's would be; a scripted upstream
             (bench/session_upstream.py) answers the agent's turns and relays only the questions
             to the model. Asked with recall on and with it off (condenser serves any
             condenser_recall call the model makes).
An answer scores when it contains the exact value. Retention is forwarded over whole.

  python3 bench/probe.py --base-url http://127.0.0.1:8000 --model smollm2 --window 8192 \\
      --no-system --flatten --rounds 5 --condenser-window 2048
  OPENAI_API_KEY=... python3 bench/probe.py --base-url https://api.openai.com --model gpt-4o-mini \\
      --api-key-env OPENAI_API_KEY --window 128000 --rounds 40 --condenser-window 32000
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import session_facts  # noqa: E402
from real_model import free_port, get, series, wait_up  # noqa: E402

ASK = ("Answer from the conversation above only, with the exact value and nothing else. "
       "If it is not there, answer: unknown.")


def call(url, body, key):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=1800) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        return {"error": error.read().decode("utf-8", "replace")[:300]}


def answer_of(reply):
    try:
        return reply["choices"][0]["message"].get("content") or ""
    except (KeyError, IndexError, TypeError):
        return ""


def usage_of(reply):
    usage = reply.get("usage") or {}
    return usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)


def question_body(args, messages, question):
    return {"model": args.model, "max_tokens": 48, "temperature": 0, "stream": False,
            "messages": messages + [{"role": "user", "content": f"PROBE QUESTION: {question} {ASK}"}]}


def conversation(args, body):
    messages = session_facts.to_chat(body)
    if args.no_system:
        messages = [m for m in messages if m["role"] != "system"]
    return messages


def whole(args, key, messages, facts):
    scored, tokens = [], [0, 0]
    for question, expected in facts:
        body = question_body(args, messages, question)
        if args.flatten:
            body["messages"] = session_facts.flatten(body["messages"])
        reply = call(args.base_url.rstrip("/") + "/v1/chat/completions", body, key)
        for i, n in enumerate(usage_of(reply)):
            tokens[i] += n
        scored.append((question, expected, answer_of(reply) or reply.get("error", "")))
    return scored, tokens


def forwarded(args, key, chats, facts, recall, out):
    os.makedirs(out, exist_ok=True)
    for stale in ("summaries.jsonl", "asked.jsonl", "forwarded.json"):
        if os.path.exists(os.path.join(out, stale)):
            os.remove(os.path.join(out, stale))
    up, port = free_port(), free_port()
    summarizer = (args.summarizer_url or args.base_url).rstrip("/")
    stub = subprocess.Popen([sys.executable, os.path.join(HERE, "session_upstream.py"), str(up), out, summarizer,
                             args.base_url], env={**os.environ, "FLATTEN": "1" if args.flatten else "0"})
    config = os.path.join(out, "condenser.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:{port}"
[upstream]
base_url = "http://127.0.0.1:{up}"
[context]
keep_recent_messages = 6
[summarizer]
model = "{args.summarizer_model or args.model}"
base_url = "http://127.0.0.1:{up}/summarizer"
api = "chat"
via = "separate"
context_window = {args.summarizer_window or args.window}
max_summary_tokens = {args.summary_tokens}
timeout_secs = 1800
[recall]
enabled = {"true" if recall else "false"}
[models."{args.model}"]
context_window = {args.condenser_window}
""")
    log = open(os.path.join(out, "condenser.log"), "w")
    proxy = subprocess.Popen([args.binary, "--config", config, "--log-format", "json"], stderr=log,
                             env={**os.environ, "RUST_LOG": "info"})
    scored, tokens = [], [0, 0]
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz")
        wait_up(f"http://127.0.0.1:{up}/")
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for messages in chats[:-1]:
            call(url, {"model": args.model, "max_tokens": 256, "messages": messages}, key)
            time.sleep(0.3)
            while json.loads(get(f"http://127.0.0.1:{up}/inflight"))["inflight"]:
                time.sleep(0.5)
        for question, expected in facts:
            reply = call(url, question_body(args, chats[-1], question), key)
            for i, n in enumerate(usage_of(reply)):
                tokens[i] += n
            scored.append((question, expected, answer_of(reply) or reply.get("error", "")))
            while json.loads(get(f"http://127.0.0.1:{up}/inflight"))["inflight"]:
                time.sleep(0.5)
        metrics = get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proxy.terminate()
        stub.terminate()
        proxy.wait()
        stub.wait()
    summarizer_tokens = sum(series(metrics, "condenser_summarizer_tokens_total").values())
    return scored, tokens, int(summarizer_tokens)


def score(scored):
    return sum(1 for _, expected, answer in scored if expected in answer)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--session", default=os.path.join(HERE, "..", "tests/fixtures/sessions/claude-code-2.0.77.jsonl.zst"))
    parser.add_argument("--base-url", required=True, help="the model's OpenAI-compatible origin (without /v1)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default="", help="the environment variable holding its key")
    parser.add_argument("--window", type=int, required=True, help="the model's context window, in tokens")
    parser.add_argument("--rounds", type=int, default=40, help="requests of the session replayed; the last is asked")
    parser.add_argument("--condenser-window", type=int, required=True,
                        help="the window condenser is told the model has: below the session's size, so it compacts")
    parser.add_argument("--summarizer-url", default="", help="default: the model's own --base-url")
    parser.add_argument("--summarizer-model", default="")
    parser.add_argument("--summarizer-window", type=int, default=0, help="default: --window")
    parser.add_argument("--summary-tokens", type=int, default=512)
    parser.add_argument("--no-system", action="store_true", help="leave the agent's system prompt out, both ways")
    parser.add_argument("--flatten", action="store_true", help="tool calls and outputs as plain turns, both ways")
    parser.add_argument("--recall", choices=["both", "on", "off"], default="both")
    parser.add_argument("--binary", default=os.path.join(HERE, "..", "target/release/condenser"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "probe"))
    args = parser.parse_args()
    key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""
    batches = list(range(2, args.rounds - 1, max(1, (args.rounds - 3) // 6)))[:6]
    facts = session_facts.facts(batches)
    bodies = [session_facts.plant(b, batches) for b in session_facts.load(args.session)[:args.rounds]]
    chats = [conversation(args, b) for b in bodies]
    name = os.path.basename(args.session).split(".jsonl")[0]
    out = os.path.join(args.out, f"{name}-{args.model.replace('/', '_')}-{args.rounds}")
    os.makedirs(out, exist_ok=True)

    results = {"session": name, "model": args.model, "rounds": args.rounds, "facts": len(facts),
               "condenser_window": args.condenser_window}
    scored, tokens = whole(args, key, chats[-1], facts)
    results["whole"] = {"score": score(scored), "answers": scored, "tokens": tokens}
    for recall in (["on", "off"] if args.recall == "both" else [args.recall]):
        scored, tokens, summarizer = forwarded(args, key, chats, facts, recall == "on", os.path.join(out, f"recall-{recall}"))
        results[f"recall_{recall}"] = {"score": score(scored), "answers": scored, "tokens": tokens,
                                       "summarizer_tokens": summarizer}
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(results, f, indent=1)
    whole_score = results["whole"]["score"]
    print(f"{name}, {args.rounds} requests, {len(facts)} facts, model {args.model}, condenser window {args.condenser_window}")
    print(f"  whole:                {whole_score}/{len(facts)}  (tokens in/out {results['whole']['tokens']})")
    for recall in ("on", "off"):
        r = results.get(f"recall_{recall}")
        if r:
            retention = f"{r['score'] / whole_score:.2f}" if whole_score else "n/a (whole scored 0)"
            print(f"  forwarded, recall {recall}: {r['score']}/{len(facts)}  retention {retention}  "
                  f"(tokens in/out {r['tokens']}, summarizer {r['summarizer_tokens']})")


if __name__ == "__main__":
    main()
