"""One agent's data plane as its :class:`~failsoft.runtime.cluster.AgentRef` uses it.

The link asks the agent for its endpoint once (a control call over Ray), keeps one
:class:`~failsoft.runtime.dataplane.client.DataPlaneClient` per event loop that calls it (the
gateway has one loop; a test or a tool may have another), and makes a new connection after one is
lost: a restarted agent serves on a new endpoint, which the next call asks for.

``$FAILSOFT_DATA_PLANE`` chooses the transport of inference calls: ``zmq`` (the default) or ``ray``
(every call an actor call, as before the data plane; loads, unloads, status and chaos are Ray calls
either way).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, ServerUnavailableError
from failsoft.runtime.dataplane.client import DataPlaneClient

ENV = "FAILSOFT_DATA_PLANE"
TRANSPORTS = ("zmq", "ray")
ENDPOINT_TIMEOUT_S = 2.0  # asking a (re)starting agent for its endpoint waits at most this long
ABSENT_RETRY_S = 5.0  # an agent that serves no data plane is asked again after this long


class NoDataPlane(ServerUnavailableError):
    """The agent could not open its socket (it said why in its log): call it over Ray instead."""


def transport() -> str:
    """The inference transport ``$FAILSOFT_DATA_PLANE`` names (default ``zmq``)."""
    value = os.environ.get(ENV, "").strip().lower() or "zmq"
    if value not in TRANSPORTS:
        raise ConfigError(f"${ENV}={value!r}: expected one of {', '.join(TRANSPORTS)}")
    return value


@dataclass(frozen=True, slots=True)
class LinkChange:
    """The connection to ``server``'s agent (process ``incarnation``) was made (``up``) or ended:
    what the controller is told."""

    server: str
    incarnation: str | None
    up: bool
    reason: str
    at: float  # time.monotonic() when the gateway saw it


Fetch = Callable[[float], Awaitable[dict[str, Any]]]  # the agent's data_plane(), over Ray


class DataPlaneLink:
    """The data plane of one agent; ``listener`` hears of every connection made and lost.

    One connection per event loop that calls (ZeroMQ's asyncio sockets belong to one loop): the
    gateway's, and any other a tool or a benchmark runs its own calls on."""

    def __init__(self, server: str, what: str, fetch: Fetch) -> None:
        self.server = server
        self.what = what
        self._fetch = fetch
        self.listener: Callable[[LinkChange], None] | None = None
        self._clients: dict[asyncio.AbstractEventLoop, DataPlaneClient] = {}
        self._absent_until = float("-inf")  # the agent said it serves none: Ray until then

    @property
    def absent(self) -> bool:
        """The agent serves no data plane (it could not bind): its calls go over Ray for a while."""
        return time.monotonic() < self._absent_until

    async def infer(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None,
        meta: dict[str, str] | None = None,
    ) -> np.ndarray:
        client = self._clients.get(asyncio.get_running_loop())
        if client is None or client.lost is not None:
            client = await self._connect(timeout_s)
        return await client.infer(app, variant, batch, timeout_s, request_id, meta)

    def start(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None,
        meta: dict[str, str] | None = None,
    ) -> asyncio.Future[np.ndarray] | None:
        """:meth:`infer` sent at once over this loop's open connection: the reply's future (no
        timer: the caller keeps the deadline); None when there is no open connection (await
        :meth:`infer`, which makes one)."""
        client = self._clients.get(asyncio.get_running_loop())
        if client is None or client.lost is not None:
            return None
        return client.start(app, variant, batch, timeout_s, request_id, meta)

    async def connect(self, timeout_s: float) -> None:
        """Make this loop's connection now, before any request needs it (the gateway does so for
        every agent at start: a connection known up is what tells a late heartbeat from a death)."""
        client = self._clients.get(asyncio.get_running_loop())
        if client is None or client.lost is not None:
            await self._connect(timeout_s)

    def cancel_nowait(self, request_id: str) -> bool:
        """Withdraw over this loop's connection; False when there is none (the caller uses Ray)."""
        client = self._current()
        if client is None or client.lost is not None:
            return False
        client.cancel_nowait(request_id)
        return True

    async def _connect(self, timeout_s: float) -> DataPlaneClient:
        """A new connection to the endpoint the agent reports now."""
        loop = asyncio.get_running_loop()
        info = await self._fetch(min(timeout_s, ENDPOINT_TIMEOUT_S))
        endpoint = info.get("endpoint")
        if not endpoint:
            self._absent_until = time.monotonic() + ABSENT_RETRY_S
            raise NoDataPlane(f"{self.what}: serves no data plane ({info.get('error')})")
        client = self._clients.get(loop)
        if client is not None and client.lost is None:
            return client  # another call connected while this one asked
        incarnation = None if info.get("incarnation") is None else str(info["incarnation"])

        def changed(up: bool, why: str) -> None:
            if self.listener is not None:
                self.listener(LinkChange(self.server, incarnation, up, why, time.monotonic()))

        watch = None if not info.get("watch") else str(info["watch"])
        client = self._clients[loop] = DataPlaneClient(str(endpoint), self.what, changed, watch)
        for other in [other for other in self._clients if other.is_closed()]:
            del self._clients[other]  # a finished loop's connection went with it
        return client

    def close(self) -> None:
        """Close the calling loop's connection (no listener is told)."""
        client = self._current()
        if client is not None:
            client.close()
            self._clients = {loop: c for loop, c in self._clients.items() if c is not client}

    def _current(self) -> DataPlaneClient | None:
        try:
            return self._clients.get(asyncio.get_running_loop())
        except RuntimeError:  # no loop runs here
            return None
