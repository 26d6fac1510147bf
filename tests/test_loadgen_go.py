"""A gated load process takes request parameters made after it started: the failover benchmark
registers an slo service's client only once its load is ready to keep it alive (the service forgets
a client silent for 10 s, and a load process can take that long to start on a busy host)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from failsoft.runtime.loadgen import LoadProcess, LoadSpec


@pytest.fixture
def recorder():
    """A real HTTP server on 127.0.0.1 that records each request's parameters and answers 503."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the client's health request before it says ready
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body.get("parameters") or {})
            reply = b'{"error": "recorded"}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _gated(url: str) -> LoadProcess:
    spec = LoadSpec(url, {"a": (4,)}, 0.05, 2.0, 0.01, max_in_flight=1, gated=True,
                    parameters={"a": {"client": "from-the-spec"}})  # fmt: skip
    load = LoadProcess(spec).start()
    assert load.wait_ready(60.0)
    return load


def test_parameters_given_with_go_replace_the_specs(recorder):
    url, seen = recorder
    load = _gated(url)
    assert seen == []  # ready, and nothing sent before go
    load.go({"a": {"client": "registered-after-start"}})
    samples = load.join(30.0)
    assert samples and seen and all(p.get("client") == "registered-after-start" for p in seen)


def test_go_without_parameters_keeps_the_specs(recorder):
    url, seen = recorder
    load = _gated(url)
    load.go()
    deadline = time.monotonic() + 30.0
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    load.stop()
    assert seen and all(p.get("client") == "from-the-spec" for p in seen)
