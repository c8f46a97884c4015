"""A real OpenAI-style chat-completions server on 127.0.0.1 for the ChatAPIJudge tests.

The test gives the server a `behaviour(request_json) -> action` function; actions:
    ("reply", text)                       200 with a chat-completions body whose content is text
    ("status", code, body, headers)       that HTTP status, body text and extra headers
    ("body", raw_bytes)                   200 with exactly these bytes (e.g. not JSON)
    ("hang", seconds)                     sleep (capped at 2 s) before replying "Preferred: A"
Every request is recorded (JSON body and headers); `in_flight_max` is the largest number of
requests the server was handling at once.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

MAX_HANG_S = 2.0


def completion_body(text: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    ).encode()


class FakeChatServer:
    def __init__(self) -> None:
        self.behaviour = lambda request: ("reply", "Comparison: fine.\nPreferred: A")
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.in_flight_max = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                with server.lock:
                    server.in_flight += 1
                    server.in_flight_max = max(server.in_flight_max, server.in_flight)
                try:
                    self._handle()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _handle(self):
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length))
                with server.lock:
                    server.requests.append(request)
                    server.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    return self._send(404, b"not found")
                action = server.behaviour(request)
                kind = action[0]
                if kind == "reply":
                    return self._send(200, completion_body(action[1]))
                if kind == "status":
                    _, code, body, headers = action
                    return self._send(code, body.encode(), headers)
                if kind == "body":
                    return self._send(200, action[1])
                if kind == "hang":
                    time.sleep(min(action[1], MAX_HANG_S))
                    return self._send(200, completion_body("Preferred: A"))
                raise ValueError(f"unknown action {action!r}")

            def _send(self, code, body: bytes, headers=None):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, address: None  # no tracebacks for dropped clients
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def user_message(self, request: dict) -> str:
        return [m for m in request["messages"] if m["role"] == "user"][-1]["content"]


@pytest.fixture()
def chat_server():
    server = FakeChatServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        server.thread.join(timeout=5)
