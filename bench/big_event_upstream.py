#!/usr/bin/env python3
"""An upstream that answers every POST with one SSE stream: a single chat-completion event
of SIZE bytes written in 16 KiB chunks, then `data: [DONE]`; with `open`, the event is never
ended (no blank line, no `[DONE]`) before the stream ends. For bench/big_event.sh and
bench/stream_memory.sh.

usage: big_event_upstream.py PORT SIZE [open]
"""
import socket
import sys
import threading

CHUNK = 16 * 1024


def event(size, ended):
    head = b'data: {"choices":[{"index":0,"delta":{"content":"'
    tail = b'"}}]}\n\n' if ended else b""
    return head + b"x" * (size - len(head) - len(tail)) + tail


def serve(conn, body, ended):
    with conn:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            rest += conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        for at in range(0, len(body), CHUNK):
            piece = body[at : at + CHUNK]
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        done = b"data: [DONE]\n\n" if ended else b""
        if done:
            conn.sendall(b"%x\r\n%s\r\n" % (len(done), done))
        conn.sendall(b"0\r\n\r\n")


def main():
    port, size = int(sys.argv[1]), int(sys.argv[2])
    ended = sys.argv[3:] != ["open"]
    body = event(size, ended)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn, body, ended), daemon=True).start()


if __name__ == "__main__":
    main()
