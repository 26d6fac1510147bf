"""The gateway's end of the data plane: one ZeroMQ DEALER socket per agent, on the gateway's loop.

Requests are matched to replies by a sequence number of this connection; the request id travels
too, for withdrawals. Requests are sent and replies read without pyzmq's asyncio layer (a future
per send and per receive, and a reader task woken for every reply): the loop watches the socket's
file descriptor itself (``loop.add_reader``) and the callback reads every reply there is, without
blocking, straight into the waiting futures; a monitor task watches the connection itself. The
socket sends ZMTP heartbeats (``ZMQ_HEARTBEAT_IVL``) and gives up on a peer
that has not answered them within ``ZMQ_HEARTBEAT_TIMEOUT``; libzmq's I/O thread answers them in
the agent without Python's interpreter, so a busy agent keeps its connection.

**A connection that ends is a crash signal.** When the agent's process dies, its kernel closes
the socket and the monitor reports the disconnection: every request waiting on this connection
fails at once with :class:`~failsoft.errors.ServerUnavailableError` (the dispatchers then move it
to the app's next route), and ``on_change(False, reason)`` is told (as ``on_change(True, ...)`` was
told when it was made). A connection once lost stays lost: the next call makes a new one (to the
endpoint a restarted agent reports).

But the kernel closes a killed process's sockets only at the end of its teardown, once it has
released the address space: for an agent (torch, Ray and the models mapped, ~80 threads) that
took 80 ms to 2.3 s on a busy two-core host, measured from the SIGKILL to the monitor's event,
while the death is in ``/proc`` at once. So the client also *watches* the agent through its
heartbeat sidecar (``watch``: :class:`~failsoft.runtime.pulse.Watchers`), a small process that
outlives it and looks for its death every few milliseconds: when the sidecar writes that the agent
died (the proof the controller takes from it too), the connection ends as above. A watch that ends
without that word (the agent stopping its sidecar) proves nothing and is only let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from failsoft.errors import DeadlineExceededError, FailsoftError, OverloadedError, ServerUnavailableError
from failsoft.runtime.dataplane import frames
from failsoft.runtime.pulse import DEAD

log = logging.getLogger(__name__)
HEARTBEAT_IVL_MS = 100
# Past this long without a heartbeat's answer the connection ends (a stopped or unreachable agent).
# Long: a crash ends the connection at once without it, and a hang is the heartbeats' to detect.
HEARTBEAT_TIMEOUT_MS = 2000
ZERO_COPY_BYTES = 65536  # smaller messages are copied: cheaper than tracking a zero-copy frame
_ENDED = {zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED, zmq.EVENT_MONITOR_STOPPED}


class DataPlaneClient:
    """A persistent connection to one agent's :class:`~failsoft.runtime.dataplane.server.DataPlaneServer`.

    Made and used on one event loop. ``on_change(up, why)`` is called from that loop once the
    connection is made (``True``), and once when it ends without :meth:`close` (``False``: the agent
    died, or stopped answering heartbeats).
    """

    def __init__(
        self,
        endpoint: str,
        what: str,
        on_change: Callable[[bool, str], None] | None = None,
        watch: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.watch = watch  # host:port of the agent's sidecar's watch (module docstring); None: none
        self.what = what
        self.on_change = on_change
        self.lost: str | None = None  # why the connection ended, once it has
        self.connected_at: float | None = None
        self.lost_at: float | None = None  # time.monotonic() when the end was seen
        self._seq = itertools.count()
        self._pending: dict[int, asyncio.Future[np.ndarray]] = {}
        context = zmq.asyncio.Context.instance()
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._socket.setsockopt(zmq.RECONNECT_IVL, -1)  # an ended connection is not retried
        # sent and read through this plain shadow: the asyncio socket serves only to make the monitor
        self._sync: zmq.Socket[Any] = zmq.Socket.shadow(self._socket.underlying)
        self._monitor = self._socket.get_monitor_socket()
        self._socket.connect(endpoint)
        self._loop = asyncio.get_running_loop()
        self._fd = self._sync.FD
        self._loop.add_reader(self._fd, self._read)
        self._tasks = [asyncio.ensure_future(self._watch())]
        if watch:
            self._tasks.append(asyncio.ensure_future(self._watch_sidecar(watch)))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def infer(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None = None,
        meta: dict[str, str] | None = None,
    ) -> np.ndarray:
        """``batch``'s answer within ``timeout_s``; the agent's failsoft errors re-raised as they are.
        ``meta`` (plain strings: a trace context) travels in the header."""
        future = self.start(app, variant, batch, timeout_s, request_id, meta)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise DeadlineExceededError(
                f"{self.what}.infer: no answer within {timeout_s * 1000:.0f} ms"
            ) from None

    def start(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None = None,
        meta: dict[str, str] | None = None,
    ) -> asyncio.Future[np.ndarray]:
        """Send the request now; the future its reply completes (the agent's failsoft error, or
        ServerUnavailableError when the connection ends first). No timer: ``timeout_s`` only
        travels to the agent; the caller keeps its deadline and cancels the future to give up."""
        if self.lost is not None:
            raise ServerUnavailableError(f"{self.what}: connection lost ({self.lost})")
        seq = next(self._seq)
        fields, data = frames.tensor_frames(batch)
        head = {
            "op": "infer",
            "seq": seq,
            "id": request_id,
            "app": app,
            "variant": variant,
            "timeout_s": timeout_s,
            "sent_at": time.time(),
            **fields,
        }
        if meta:
            head["meta"] = meta
        try:
            self._sync.send_multipart(
                [frames.dump(head), data], zmq.NOBLOCK, copy=len(data) < ZERO_COPY_BYTES
            )
        except zmq.Again:  # SNDHWM requests already wait to leave: the agent does not keep up
            raise OverloadedError(f"{self.what}: the data plane's send queue is full", 0.05) from None
        except zmq.ZMQError as exc:
            raise ServerUnavailableError(f"{self.what}: data plane send failed: {exc}") from exc
        finally:
            self._sent()
        future: asyncio.Future[np.ndarray] = self._loop.create_future()
        self._pending[seq] = future
        future.add_done_callback(lambda _: self._pending.pop(seq, None))  # answered, failed, given up
        return future

    def cancel_nowait(self, request_id: str) -> None:
        """Withdraw ``request_id`` from the agent's queue; fire and forget."""
        if self.lost is not None:
            return
        with contextlib.suppress(zmq.ZMQError):
            self._sync.send_multipart([frames.dump({"op": "cancel", "id": request_id})], zmq.NOBLOCK)
        self._sent()

    def _sent(self) -> None:
        """After a send: a send may take the read signal of the socket's (edge-triggered) fd, so a
        reply already there is read on the loop's next turn, as pyzmq's asyncio layer does."""
        with contextlib.suppress(zmq.ZMQError):
            if int(self._sync.get(zmq.EVENTS)) & zmq.POLLIN:
                self._loop.call_soon(self._read)

    def close(self) -> None:
        """End the connection (no ``on_change``); waiting calls fail ServerUnavailableError."""
        if self.lost is None:
            self._end("closed", report=False)

    # background ---------------------------------------------------------------------------------
    def _read(self) -> None:
        """Every reply there is, delivered (the socket's fd was signalled, or a send may have taken
        the signal); reading until none is left re-arms the edge-triggered fd."""
        if self.lost is not None:
            return
        while True:
            try:
                message = self._sync.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:  # none left (Again), or the socket closed
                return
            self._deliver(message)

    def _deliver(self, message: list[Any]) -> None:
        try:
            head = frames.header(message[0])
            future = self._pending.get(int(head["seq"]))
            if future is None or future.done():  # answered after its caller gave up
                return
            if head.get("ok"):
                future.set_result(frames.tensor(head, message[1]))
            else:
                future.set_exception(frames.error_of(head))
        except (FailsoftError, KeyError, ValueError, TypeError, IndexError) as exc:
            log.warning("%s: unreadable reply dropped: %s", self.what, exc)

    async def _watch(self) -> None:
        while True:
            try:
                event = parse_monitor_message(await self._monitor.recv_multipart())
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.connected_at is None:
                self.connected_at = time.monotonic()
                self._tell(True, "connected")
            elif kind in _ENDED or (kind == zmq.EVENT_CONNECT_RETRIED and self.connected_at is None):
                reason = "the agent closed it" if self.connected_at is not None else "no agent listens"
                self._end(f"{reason}: {_event_name(kind)}", report=True)
                return

    async def _watch_sidecar(self, watch: str) -> None:
        """End the connection when the agent's sidecar says the agent died."""
        host, _, port = watch.rpartition(":")
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except (OSError, ValueError) as exc:  # the connection's own end still tells
            log.info("%s: no watch of the agent at %s (%s)", self.what, watch, exc)
            return
        try:
            said = await reader.read(64)  # the sidecar writes only at the death; b"": it is gone
        except OSError as exc:
            said = str(exc).encode()
        except asyncio.CancelledError:  # closed, or ended by the connection's own end
            writer.close()
            raise
        writer.close()
        if said != DEAD:  # the sidecar went without a word (the agent stopping it): no proof of death
            log.info("%s: the agent's watch ended without a death notice (%r)", self.what, said)
        elif self.lost is None:
            self._end("the agent died (its sidecar saw it)", report=True)

    def _end(self, reason: str, report: bool) -> None:
        self.lost, self.lost_at = reason, time.monotonic()
        error = ServerUnavailableError(f"{self.what}: connection lost ({reason})")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        with contextlib.suppress(ValueError, OSError):  # the loop closed first
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disable_monitor()
        self._monitor.close(0)
        self._socket.close(0)
        if report:
            self._tell(False, reason)

    def _tell(self, up: bool, why: str) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(up, why)
        except Exception as exc:  # a listener's fault must not keep the calls from moving
            log.warning("%s: a connection listener failed: %s", self.what, exc)


def _event_name(kind: int) -> str:
    with contextlib.suppress(ValueError):
        return str(zmq.Event(kind).name)
    return str(kind)
