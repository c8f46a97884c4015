"""The server client's deadlines, against local HTTP endpoints that misbehave on purpose (no vLLM):
a server that never answers is `WeightSyncTimeout` within the client's deadline and its retries;
a server whose own load deadline passed (an HTTP error saying "timed out") is `WeightSyncTimeout`
too; a refused version stamp is `WeightVersionError`; any other HTTP error is `ServerError`."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from lit_rlhf.generation.server import ServerClient, ServerError, VLLMServer
from lit_rlhf.generation.weight_sync import WeightSyncTimeout, WeightVersionError


@pytest.fixture
def silent_url():
    """A socket that accepts connections and reads, but never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def answering(status: int, text: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def http_server():
    servers = []

    def start(status: int, text: str) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), answering(status, text))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_server_that_never_answers_is_a_timeout_within_the_deadline(silent_url, tmp_path):
    client = ServerClient(VLLMServer(silent_url), "model", timeout=0.2, retries=2)
    started = time.perf_counter()
    with pytest.raises(WeightSyncTimeout, match=r"no answer from the vLLM server at .* within 0\.2 s \(2 tries\)"):
        client.load_weights_file(tmp_path / "weights.safetensors", 4)
    assert time.perf_counter() - started < 10  # two 0.2 s reads and one 1 s pause between them


@pytest.mark.parametrize("status, text, error, match", [
    (500, "TimeoutError: collective_rpc timed out", WeightSyncTimeout, r"did not load version 4 within 3\.0 s"),
    (500, "ValueError: w.safetensors is stamped version 3, the trainer asked to load version 4",
     WeightVersionError, "refused .* as version 4"),
    (500, "RuntimeError: out of memory", ServerError, r"HTTP 500: RuntimeError: out of memory"),
])
def test_the_servers_errors_are_named(http_server, status, text, error, match, tmp_path):
    client = ServerClient(VLLMServer(http_server(status, text)), "model", timeout=3.0, retries=1)
    with pytest.raises(error, match=match):
        client.load_weights_file(tmp_path / "w.safetensors", 4)


def test_a_worker_that_loaded_another_version_is_a_version_error(http_server, tmp_path):
    client = ServerClient(VLLMServer(http_server(200, '{"results": ["3"]}')), "model", timeout=3.0, retries=1)
    with pytest.raises(WeightVersionError, match=r"loaded \['3'\] when version 4 was sent"):
        client.load_weights_file(tmp_path / "w.safetensors", 4)
