"""Many concurrent SSE streams through condenser, for bench/streams.sh.

  streams.py upstream PORT HOLD_SECONDS
      An SSE upstream for chat completions: a first delta at once, the rest after
      HOLD_SECONDS, so every stream is open at the same time, then usage and [DONE].
  streams.py clients PORT COUNT
      COUNT streamed chat requests at once to condenser on PORT; prints how many ended with
      [DONE] and what the others got.
"""

import asyncio
import json
import resource
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

mode, port = sys.argv[1], int(sys.argv[2])


def event(payload):
    data = f"data: {payload}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def chunk(content):
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                       "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]})


async def serve(reader, writer):
    hold = float(sys.argv[3])
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n" + event(chunk("Hello")))
            await writer.drain()
            await asyncio.sleep(hold)
            usage = json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
                                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}})
            writer.write(event(chunk(" world")) + event(usage) + event("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def upstream():
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=16384)
    async with server:
        await server.serve_forever()


BODY = json.dumps({"model": "gpt-4o", "stream": True,
                   "messages": [{"role": "user", "content": "Say hello."}]}).encode()


async def one(semaphore):
    async with semaphore:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer sk-bench\r\nconnection: close\r\n"
                     + f"content-length: {len(BODY)}\r\n\r\n".encode() + BODY)
        await writer.drain()
        answer = await reader.read()
        return "done" if b"[DONE]" in answer else answer.split(b"\r\n", 1)[0].decode(errors="replace")
    except ConnectionError as e:
        return type(e).__name__
    finally:
        writer.close()


async def clients(count):
    # Connections opened a few hundred at a time, so the listen backlog never overflows.
    semaphore = asyncio.Semaphore(256)
    results = await asyncio.gather(*(one(semaphore) for _ in range(count)))
    done = results.count("done")
    others = {}
    for result in results:
        if result != "done":
            others[result] = others.get(result, 0) + 1
    print(json.dumps({"streams": count, "complete": done, "others": others}))


if mode == "upstream":
    asyncio.run(upstream())
else:
    asyncio.run(clients(int(sys.argv[3])))
