"""The scripted upstream of bench/peers.sh: one asyncio process on loopback that every proxy is
put in front of, so that all of them, and the upstream alone, are measured against the same
thing. It answers at once; what a run times is the proxies' own work.

- POST .../chat/completions: a small chat.completion, or the same streamed as SSE chunks
  when the body asks for `"stream": true`.
- POST .../messages: an Anthropic message, or its SSE events when streamed. With BODIES set,
  its body is kept (below).
- Anything else (health checks, model lists): 200 with an empty list.

With BODIES=DIR, each Messages request's body is also written to DIR, numbered in the order
they came, for bench/peers_replay.py to judge and bill once the run is over (judging them here
would add its time to every request's).

Usage: peers_upstream.py PORT
"""

import asyncio
import json
import os
import sys

CHAT = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000,
    "model": "gpt-4o-2024-08-06",
    "choices": [{"index": 0, "message": {"role": "assistant", "content":
                 "Sure. The deployment looks healthy: latency is within budget and no errors were logged.",
                 "refusal": None}, "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138},
    "system_fingerprint": "fp_bench"}).encode()


def chunk(delta, finish=None, usage=None):
    return ("data: " + json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "gpt-4o-2024-08-06",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": usage}) + "\n\n")


CHAT_SSE = (chunk({"role": "assistant", "content": ""})
            + "".join(chunk({"content": t}) for t in ["Sure.", " The deployment", " looks healthy."])
            + chunk({}, finish="stop")
            + chunk(None, usage={"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138})
            + "data: [DONE]\n\n").encode()

TEXT = "Done. The command ran and its output is above."


def message(usage):
    return json.dumps({"id": "msg_bench", "type": "message", "role": "assistant",
                       "model": "claude-sonnet-4-5-20250929",
                       "content": [{"type": "text", "text": TEXT}],
                       "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}).encode()


def message_sse(usage):
    def event(name, data):
        return f"event: {name}\ndata: {json.dumps(data)}\n\n"
    start = {"id": "msg_bench", "type": "message", "role": "assistant", "content": [],
             "model": "claude-sonnet-4-5-20250929", "stop_reason": None, "stop_sequence": None,
             "usage": dict(usage, output_tokens=1)}
    return (event("message_start", {"type": "message_start", "message": start})
            + event("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}})
            + event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": TEXT}})
            + event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                      "usage": {"output_tokens": 12}})
            + event("message_stop", {"type": "message_stop"})).encode()


BODIES = os.environ.get("BODIES")
RECEIVED = 0


def keep(body):
    global RECEIVED
    RECEIVED += 1
    with open(os.path.join(BODIES, f"{RECEIVED:05d}.json"), "wb") as f:
        f.write(body)


def answer(method, path, body):
    """(content type, reply body) for a request."""
    if method != "POST":
        return "application/json", b'{"object":"list","data":[]}'
    streamed = b'"stream":true' in body or b'"stream": true' in body
    if "/messages" in path:
        if BODIES:
            keep(body)
        usage = {"input_tokens": max(1, len(body) // 4), "output_tokens": 12,
                 "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
        return ("text/event-stream", message_sse(usage)) if streamed else ("application/json", message(usage))
    return ("text/event-stream", CHAT_SSE) if streamed else ("application/json", CHAT)


class Http(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data):
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            rest = self.buffer[end + 4:]
            if "chunked" in headers.get("transfer-encoding", ""):
                body, rest = self.dechunk(rest)
                if body is None:
                    return
            else:
                length = int(headers.get("content-length", 0))
                if len(rest) < length:
                    return
                body, rest = rest[:length], rest[length:]
            self.buffer = rest
            kind, reply = answer(method, path, body)
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                                 % (kind.encode(), len(reply), reply))
            if headers.get("connection", "").lower() == "close":
                self.transport.close()
                return

    @staticmethod
    def dechunk(data):
        body, at = b"", 0
        while True:
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                return None, data
            size = int(data[at:line_end].split(b";")[0], 16)
            if len(data) < line_end + 2 + size + 2:
                return None, data
            body += data[line_end + 2:line_end + 2 + size]
            at = line_end + 2 + size + 2
            if size == 0:
                return body, data[at:]


async def main(port):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Http, "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


asyncio.run(main(int(sys.argv[1])))
