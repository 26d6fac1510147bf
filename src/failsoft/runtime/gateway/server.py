"""The HTTP server the gateway runs in: uvicorn, with Ctrl-C as the normal end of serving.

uvicorn (0.29 and later) catches SIGINT and SIGTERM, shuts down gracefully, and then raises the
signal again, so that the process dies of it. ``failsoft serve`` has more to stop after the gateway
(the agents, the controller, Ray) and reports it; for it, a Ctrl-C is how serving ends, not an
error, so :class:`GatewayServer` does not raise the signal again.

Both sessions (``failsoft serve``'s and ``failsoft llm serve``'s) run it either in the main thread
(:meth:`uvicorn.Server.run`) or in a daemon thread (:meth:`GatewayServer.start_in_thread`, for tests,
benchmarks and the demo), and stop it the same way (:meth:`GatewayServer.stop`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Generator

import uvicorn

from failsoft.errors import ServingError


class GatewayServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # handled: the caller stops everything and exits

    _thread: threading.Thread | None = None

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
