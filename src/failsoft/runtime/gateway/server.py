"""The HTTP server the gateway runs in: uvicorn, with Ctrl-C as the normal end of serving.

uvicorn (0.29 and later) catches SIGINT and SIGTERM, shuts down gracefully, and then raises the
signal again, so that the process dies of it. ``failsoft serve`` has more to stop after the gateway
(the agents, the controller, Ray) and reports it; for it, a Ctrl-C is how serving ends, not an
error, so :class:`GatewayServer` does not raise the signal again.

The session (``failsoft serve``'s) runs it either in the main thread
(:meth:`uvicorn.Server.run`) or in a daemon thread (:meth:`GatewayServer.start_in_thread`, for tests,
benchmarks and the demo), and stop it the same way (:meth:`GatewayServer.stop`).

The admin plane (``admin``: another uvicorn config, its own address, app and TLS) is served by a
second uvicorn server in the same event loop, started after the gateway's and stopped before it,
so that it lives exactly as long. Its socket is bound when the :class:`GatewayServer` is made: a
port in use is an error there, and :meth:`GatewayServer.admin_port` is known at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Generator, Iterator

import uvicorn

from failsoft.errors import ServingError
from failsoft.runtime.priority import GATEWAY_NICE, set_niceness


class _Companion(uvicorn.Server):
    """A server in another's loop: the signals (Ctrl-C) are that one's to handle."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _listening_socket(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except (OSError, OverflowError) as exc:  # in use, no such address; a port past 65535
        raise ServingError(
            f"the admin API cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, admin: uvicorn.Config | None = None) -> None:
        super().__init__(config)
        if admin is not None and not admin.loaded:
            admin.load()  # its app and TLS context now: a bad certificate is an error here, not later
        self.admin = None if admin is None else _Companion(admin)
        self._admin_socket = None if admin is None else _listening_socket(admin.host, admin.port)
        self._admin_task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # handled: the caller stops everything and exits

    _thread: threading.Thread | None = None

    def admin_port(self) -> int | None:
        return None if self._admin_socket is None else int(self._admin_socket.getsockname()[1])

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        with self._closing_admin_socket():
            await super().serve(sockets)

    @contextlib.contextmanager
    def _closing_admin_socket(self) -> Iterator[None]:
        try:
            yield
        finally:  # served and closed by the companion, or never served (the gateway did not start)
            if self._admin_socket is not None:
                self._admin_socket.close()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # the loop's thread ahead of model work on a shared host: a kill's connection end, the
        # calls it fails and the route that follows wait for no inference (runtime/priority.py)
        set_niceness(GATEWAY_NICE)
        await super().startup(sockets)
        if self.admin is not None and self._admin_socket is not None and not self.should_exit:
            self._admin_task = asyncio.create_task(self.admin.serve(sockets=[self._admin_socket]))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.admin is not None and self._admin_task is not None:
            self.admin.should_exit = True
            await asyncio.gather(self._admin_task, return_exceptions=True)
        await super().shutdown(sockets)

    def start_in_thread(self, name: str = "gateway", timeout_s: float = 30.0) -> int:
        """Serve from a daemon thread; returns the bound port once it listens (port 0 picks one).
        ServingError when it cannot start (the port in use) or does not within ``timeout_s``."""
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.started:
            if not self._thread.is_alive():
                where = f"{self.config.host}:{self.config.port}"
                raise ServingError(f"the gateway could not start on {where} (is the port in use?)")
            if time.monotonic() > deadline:
                raise ServingError(f"the gateway did not start within {timeout_s:.0f} s")
            time.sleep(0.02)
        return self.bound_port()

    def bound_port(self) -> int:
        """The port it listens on (the configured one until it does)."""
        sockets = [s for server in self.servers for s in server.sockets]
        return int(sockets[0].getsockname()[1]) if sockets else int(self.config.port)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask it to end (graceful shutdown) and wait for its thread, when it has one."""
        self.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def wait(self) -> None:
        """Block until its thread ends (a KeyboardInterrupt still reaches the caller: short joins)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)
