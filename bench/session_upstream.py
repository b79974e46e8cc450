"""A scripted upstream for replaying recorded agent sessions through condenser with a real
summarizer (bench/real_model.sh, bench/probe.py).

- The agent's own turns (Messages, Gemini, chat; streamed or not) are answered at once with a
  line of text, and the body condenser forwarded is kept: the last one in OUT/forwarded.json.
- `/summarizer/...` is relayed to the real summarizer (SUMMARIZER, an OpenAI-compatible base
  URL), one call at a time as a local server takes them; each call's prompt, reply and seconds
  go to OUT/summaries.jsonl. GET /inflight says how many are being made, so a driver can let
  each land before the next request, as the time between an agent's turns would.
- A chat request whose last user message starts with PROBE_MARK is a probe's question: it is
  relayed to the model under test (MODEL_URL) and its answer returned, so condenser serves any
  recall call the model makes. With FLATTEN=1 its conversation is first written as plain turns
  (bench/session_facts.py `flatten`), for a model whose template takes no tool calls.
Relayed calls carry the Authorization header condenser sent (the caller's key).

Usage: session_upstream.py PORT OUT SUMMARIZER [MODEL_URL]
"""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, OUT, SUMMARIZER = int(sys.argv[1]), sys.argv[2], sys.argv[3].rstrip("/")
MODEL_URL = (sys.argv[4] if len(sys.argv) > 4 else "").rstrip("/")
FLATTEN = os.environ.get("FLATTEN") == "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import session_facts  # noqa: E402
PROBE_MARK = "PROBE QUESTION:"
TEXT = "Running the next batch."

lock = threading.Lock()
summarizing = threading.Lock()
inflight = [0]
os.makedirs(OUT, exist_ok=True)


def relay(url, body, authorization=""):
    headers = {"content-type": "application/json"}
    if authorization:
        headers["authorization"] = authorization
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=1800) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def sse(events):
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" if name else f"data: {json.dumps(data)}\n\n"
                   for name, data in events).encode()


def prompt_tokens(raw):
    """The prompt's tokens as the reply's usage reports them: about o200k's count of the body
    (a byte in four), as a provider's count is near its own; condenser scales its estimate
    for Claude and Gemini by the ratio this teaches, which a fixed figure would pin at its
    lowest bound."""
    return max(1, len(raw) // 4)


def messages_reply(stream, prompt):
    usage = {"input_tokens": prompt, "output_tokens": 5}
    if not stream:
        return "application/json", json.dumps({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn", "usage": usage}).encode()
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
               "stop_reason": None, "usage": usage}
    return "text/event-stream", sse([
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def gemini_reply(stream, prompt):
    reply = {"candidates": [{"content": {"role": "model", "parts": [{"text": TEXT}]}, "finishReason": "STOP", "index": 0}],
             "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": 5, "totalTokenCount": prompt + 5}}
    if stream:
        return "text/event-stream", sse([(None, reply)])
    return "application/json", json.dumps(reply).encode()


def chat_reply(stream, prompt):
    if stream:
        chunk = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": TEXT}, "finish_reason": "stop"}]}
        return "text/event-stream", sse([(None, chunk)]) + b"data: [DONE]\n\n"
    return "application/json", json.dumps({
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}}).encode()


def last_user_text(body):
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, kind, data):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer(200, "application/json", json.dumps({"inflight": inflight[0]}).encode())

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        path = self.path.split("?")[0]
        if path.startswith("/summarizer/"):
            return self.summarize(path[len("/summarizer"):], raw)
        body = json.loads(raw or b"{}")
        if path.endswith("/chat/completions") and last_user_text(body).startswith(PROBE_MARK) and MODEL_URL:
            with lock:
                with open(os.path.join(OUT, "asked.jsonl"), "a") as f:
                    f.write(json.dumps(body) + "\n")
            if FLATTEN:
                body["messages"] = session_facts.flatten(body["messages"])
                raw = json.dumps(body).encode()
            status, data = relay(MODEL_URL + "/v1/chat/completions", raw, self.headers.get("authorization", ""))
            return self.answer(status, "application/json", data)
        with lock:
            with open(os.path.join(OUT, "forwarded.json"), "wb") as f:
                f.write(raw)
        stream = body.get("stream") is True or ":streamGenerateContent" in self.path
        if path.endswith("/messages"):
            kind, data = messages_reply(stream, prompt_tokens(raw))
        elif ":streamGenerateContent" in path or ":generateContent" in path:
            kind, data = gemini_reply(stream, prompt_tokens(raw))
        else:
            kind, data = chat_reply(stream, prompt_tokens(raw))
        self.answer(200, kind, data)

    def summarize(self, path, raw):
        with lock:
            inflight[0] += 1
        try:
            with summarizing:
                started = time.monotonic()
                status, data = relay(SUMMARIZER + path, raw, self.headers.get("authorization", ""))
                seconds = time.monotonic() - started
            record = {"seconds": round(seconds, 2), "status": status, "request": json.loads(raw)}
            try:
                record["reply"] = json.loads(data)
            except ValueError:
                record["reply"] = data.decode("utf-8", "replace")
            with lock:
                with open(os.path.join(OUT, "summaries.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")
            self.answer(status, "application/json", data)
        finally:
            with lock:
                inflight[0] -= 1

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
