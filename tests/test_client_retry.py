"""The client sends an idempotent request once more when the server closed the kept-alive
connection before answering (a real socket server on 127.0.0.1 that does exactly that once)."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from failsoft.client import _request

BODY = b'{"ok": true}'


def serve(listener: socket.socket, drop_first: int, seen: list[bytes]) -> None:
    """Answer each connection's request, except the first ``drop_first`` connections: closed unanswered."""
    for n in range(drop_first + 1):
        conn, _ = listener.accept()
        with conn:
            seen.append(conn.recv(65536).split(b"\r\n", 1)[0])
            if n < drop_first:
                continue  # closed without a byte: "Server disconnected without sending a response"
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
            )


@pytest.fixture
def server():
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    yield listener, seen
    listener.close()


def test_a_get_is_sent_again_when_the_connection_closed_unanswered(server) -> None:
    listener, seen = server
    thread = threading.Thread(target=serve, args=(listener, 1, seen), daemon=True)
    thread.start()
    with httpx.Client(base_url=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=10) as http:
        response = _request(http, "GET", "/admin/status")
    thread.join(timeout=10)
    assert response.json() == {"ok": True}
    assert seen == [b"GET /admin/status HTTP/1.1"] * 2


def test_a_post_is_never_sent_twice(server) -> None:
    listener, seen = server
    thread = threading.Thread(target=serve, args=(listener, 1, seen), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with httpx.Client(base_url=url, timeout=10) as http, pytest.raises(httpx.RemoteProtocolError):
        _request(http, "POST", "/v2/models/a/infer", json={})
    assert seen == [b"POST /v2/models/a/infer HTTP/1.1"]
