"""The HTTP server the gateway runs in: uvicorn, with Ctrl-C as the normal end of serving.

uvicorn (0.29 and later) catches SIGINT and SIGTERM, shuts down gracefully, and then raises the
signal again, so that the process dies of it. ``failsoft serve`` has more to stop after the gateway
(the agents, the controller, Ray) and reports it; for it, a Ctrl-C is how serving ends, not an
error, so :class:`GatewayServer` does not raise the signal again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import uvicorn


class GatewayServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # handled: the caller stops everything and exits
