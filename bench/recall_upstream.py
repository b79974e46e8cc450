"""A scripted upstream for bench/recall_round.sh, in the three APIs, whole or streamed.

The summarizer's calls get a short summary at once. The model, when `condenser_recall` is
offered and not yet answered, does what the request's `x-bench-recall` header says: `refs`
calls it for the first four references the summary names (ctx:<id>.<n>), `query` with a
search query (words both benchmark bodies have), `none` never calls it; otherwise it answers
with text at once.

Each request's own time (from its head parsed to its reply written) is kept with its kind
and the client's `x-bench-id`; `GET /stats` returns them as JSON lines and forgets them.

Usage: recall_upstream.py PORT
"""

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKER = "You compress the earlier part"
TOOL = "condenser_recall"
NAMED = re.compile(r"archived verbatim as (ctx:[0-9a-f]+)\.(\d+) to ctx:[0-9a-f]+\.(\d+)")
USAGE = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
STATS, LOCK = [], threading.Lock()


def is_summarizer(body):
    first = (body.get("messages") or [{}])[0].get("content") if body.get("messages") else None
    return any(isinstance(t, str) and t.startswith(MARKER) for t in (first, body.get("instructions"), body.get("system")))


def offers_recall(body):
    return any(t.get("name") == TOOL or (t.get("function") or {}).get("name") == TOOL for t in body.get("tools") or [])


def answered(body):
    """Whether the request ends with the answer to a recall call of ours (ids `rcl_…`)."""
    last = (body.get("messages") or body.get("input") or [{}])[-1]
    if not isinstance(last, dict):
        return False
    if isinstance(last.get("content"), list) and last["content"]:
        last = last["content"][0]  # Messages: the tool_result block
    call = last.get("tool_call_id") or last.get("call_id") or last.get("tool_use_id") or ""
    return call.startswith("rcl_")


def sse(events, named=True):
    return "".join((f"event: {e['type']}\n" if named else "") + f"data: {json.dumps(e)}\n\n" for e in events)


THINKING = {"type": "thinking", "thinking": "The port was settled early; look it up.", "signature": "EqQBCkYIBxgCKkD-bench"}


def opens_with_signed_thinking(body):
    """Anthropic's rule with thinking on: a continued assistant turn opens with the round's signed thinking."""
    return body["messages"][-2]["content"][0] == THINKING


def reply(path, stream, text=None, args=None, thinks=False):
    """A text reply, or a reply calling the recall tool with `args`: (content type, bytes). A
    Messages reply with `thinks` opens with a signed thinking block."""
    arguments = json.dumps(args) if args is not None else None
    if path.endswith("/chat/completions"):
        message = {"role": "assistant", "content": text}
        if arguments:
            message["tool_calls"] = [{"id": "rcl_0", "type": "function", "function": {"name": TOOL, "arguments": arguments}}]
        finish = "tool_calls" if arguments else "stop"
        if not stream:
            body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}
            return "application/json", json.dumps(body)
        chunk = lambda delta, fin=None: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                                         "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
        if arguments:
            deltas = [{"tool_calls": [{"index": 0, "id": "rcl_0", "type": "function", "function": {"name": TOOL, "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}]
        else:
            deltas = [{"content": text}]
        events = [chunk({"role": "assistant", "content": None if arguments else ""})] + [chunk(d) for d in deltas]
        events += [chunk({}, finish), {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
                                       "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}]
        return "text/event-stream", sse(events, named=False) + "data: [DONE]\n\n"
    if path.endswith("/responses"):
        if arguments:
            item = {"type": "function_call", "id": "fc_0", "call_id": "rcl_0", "name": TOOL, "arguments": arguments, "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        done = {"id": "resp_1", "object": "response", "status": "completed", "output": [item], "usage": USAGE}
        if not stream:
            return "application/json", json.dumps(done)
        if arguments:
            middle = [{"type": "response.output_item.added", "output_index": 0, "item": dict(item, arguments="")},
                      {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_0", "delta": arguments},
                      {"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_0", "arguments": arguments}]
        else:
            middle = [{"type": "response.output_item.added", "output_index": 0, "item": dict(item, content=[])},
                      {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": text}]
        events = [{"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}] + middle
        events += [{"type": "response.output_item.done", "output_index": 0, "item": item}, {"type": "response.completed", "response": done}]
        return "text/event-stream", sse(events)
    # Anthropic Messages
    block = {"type": "tool_use", "id": "rcl_0", "name": TOOL, "input": args} if arguments else {"type": "text", "text": text}
    blocks = [THINKING, block] if thinks else [block]
    stop = "tool_use" if arguments else "end_turn"
    if not stream:
        body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": blocks,
                "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 10}}
        return "application/json", json.dumps(body)
    start = dict(block, input={}) if arguments else dict(block, text="")
    delta = {"type": "input_json_delta", "partial_json": arguments} if arguments else {"type": "text_delta", "text": text}
    streamed = [(start, [delta])]
    if thinks:
        streamed.insert(0, (dict(THINKING, thinking="", signature=""),
                            [{"type": "thinking_delta", "thinking": THINKING["thinking"]},
                             {"type": "signature_delta", "signature": THINKING["signature"]}]))
    events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
                                                    "stop_reason": None, "usage": {"input_tokens": 100, "output_tokens": 1}}}]
    for index, (opened, deltas) in enumerate(streamed):
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events += [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 10}},
              {"type": "message_stop"}]
    return "text/event-stream", sse(events)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body are two writes: without TCP_NODELAY, the body waits out the reader's
    # delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def do_GET(self):
        with LOCK:
            lines, STATS[:] = "".join(json.dumps(s) + "\n" for s in STATS), []
        self.send(200, "application/x-ndjson", lines)

    def do_POST(self):
        started = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        path, stream = self.path.split("?")[0], body.get("stream") is True
        script = self.headers.get("x-bench-recall", "none")
        thinks = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
        if thinks and answered(body) and not opens_with_signed_thinking(body):
            self.send(400, "application/json", json.dumps({"type": "error", "error": {
                "type": "invalid_request_error", "message": "a final assistant message must start with a thinking block"}}))
            return
        if is_summarizer(body):
            kind, text, args = "summary", "## Goal and constraints\nkeep going\n## Next step\nnone", None
        elif answered(body):
            kind, text, args = "continuation", "Recalled: the service binds port 23456.", None
        elif offers_recall(body) and script != "none":
            named = NAMED.search(json.dumps(body))
            refs = [f"{named[1]}.{i}" for i in range(int(named[2]), int(named[3]) + 1)][:4] if named else ["ctx:none.0"]
            kind, text, args = "call", None, {"refs": refs} if script == "refs" else {"query": "which port does the service bind on timeout"}
        else:
            kind, text, args = "text", "A plain answer.", None
        self.send(200, *reply(path, stream, text, args, thinks and kind != "summary"))
        with LOCK:
            STATS.append({"id": self.headers.get("x-bench-id"), "kind": kind, "ms": (time.perf_counter() - started) * 1e3})

    def send(self, status, content_type, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
