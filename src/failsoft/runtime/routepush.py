"""The routing table pushed to the gateways at once, beside the long-poll: ZeroMQ PUB/SUB.

The route long-poll (:mod:`failsoft.runtime.longpoll`) is an actor call that the controller
answers when a route changes; its answer then travels back through Ray (the controller's worker,
its reply's serialization, the gateway's core worker, a hop onto the gateway's event loop). On a
busy two-core host that trip was measured at 33-46 ms from the controller's publish to the
gateway's mirror: most of the time a request in flight on a killed server waited for its next
route. So the controller also *pushes* every table it publishes on a ZeroMQ PUB socket
(:class:`RoutePublisher`), and each gateway's mirror subscribes (:class:`RouteSubscriber`) to the
endpoint the long-poll's answers name (``push``). The push is the fast path, the long-poll the
reliable one: a PUB socket drops what a slow or not yet connected subscriber cannot take, and a
restarted controller is learned of by the long-poll alone. Either may bring a table first; both
carry the controller's epoch and version, and the mirror takes a table only when it is newer than
the one it holds (:meth:`~failsoft.runtime.gateway.routes.RouteMirror.offer`), so a duplicate or a
table overtaken by a newer one changes nothing.

A message is one frame: the snapshot the long-poll answers (``epoch``, ``version``, ``ready``,
``value``, ``fences``) as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

log = logging.getLogger(__name__)
SEND_HWM = 64  # tables queued for a subscriber that does not read; past it, they are dropped
RECV_HWM = 64


class RoutePublisher:
    """The controller's end: binds ``tcp://host:<a free port>`` (:attr:`endpoint`) and sends each
    table without blocking. Used from the controller's one event loop (a ZeroMQ socket belongs to
    one thread); a failure to bind leaves the long-poll alone (``endpoint`` None)."""

    def __init__(self, host: str) -> None:
        self.endpoint: str | None = None
        self.dropped = 0
        self._socket: zmq.Socket[Any] | None = None
        try:
            socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDHWM, SEND_HWM)
            port = socket.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as exc:
            log.warning("no route push on %s (%s): gateways learn routes by long-poll only", host, exc)
            return
        self._socket, self.endpoint = socket, f"tcp://{host}:{port}"

    def send(self, snapshot: dict[str, Any]) -> None:
        """Push ``snapshot`` to every subscriber now; never blocks, never raises."""
        if self._socket is None:
            return
        try:
            self._socket.send(json.dumps(snapshot, separators=(",", ":"), default=str).encode(), zmq.NOBLOCK)
        except (zmq.ZMQError, TypeError, ValueError) as exc:  # a full queue, or a closed socket
            self.dropped += 1
            log.debug("route push dropped: %s", exc)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None


class RouteSubscriber:
    """A gateway's end: subscribes to one controller's :class:`RoutePublisher` on the calling event
    loop and hands each table it reads to ``offer`` (the mirror decides whether it is newer)."""

    def __init__(self, endpoint: str, offer: Callable[[dict[str, Any]], None]) -> None:
        self.endpoint = endpoint
        self.received = 0
        self._offer = offer
        self._socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            try:
                frame = await self._socket.recv()
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            try:
                snapshot = json.loads(frame)
                if not isinstance(snapshot, dict):
                    raise ValueError(f"a table must be a JSON object, got {type(snapshot).__name__}")
                self.received += 1
                self._offer(snapshot)
            except Exception as exc:  # a bad table must not stop the push: the long-poll has it too
                log.warning("route push from %s: table ignored (%s)", self.endpoint, exc)

    def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(zmq.ZMQError):
            self._socket.close(0)
