"""An instant upstream for bench/agent_replay.sh: answers Messages, Responses and chat
requests (the summarizer's included) at once, so that what is timed is condenser's own work.

Usage: agent_upstream.py PORT
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLIES = {
    "/v1/messages": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                     "content": [{"type": "text", "text": "A summary of the work so far."}],
                     "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}},
    "/v1/responses": {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                      "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                                  "content": [{"type": "output_text", "text": "A summary of the work so far.", "annotations": []}]}],
                      "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}},
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps(REPLIES.get(self.path.split("?")[0], REPLIES["/v1/messages"])).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
