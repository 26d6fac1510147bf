"""Heartbeats as signed UDP datagrams, judged on the kernel's arrival time (FailLite 4).

FailLite's agents push a keep-alive every 20 ms and the controller declares a failure after two
missed ones, so a heartbeat must reach the controller within ~40 ms *every time*, even on a busy
machine. A Ray actor call is the wrong vehicle for that: it queues behind the controller's other
work on its event loop, and a late message looks exactly like a missed one. failsoft therefore sends
heartbeats the way FailLite describes them, as small pushed datagrams:

* each agent's sidecar (:mod:`failsoft.runtime.pulse`) sends ``server|incarnation|seq|mac`` every
  ``interval_s`` to the controller's UDP address while the agent process is alive and running;
* :class:`HeartbeatReceiver` (the controller's socket) keeps the kernel's arrival time of each
  datagram; the controller's health check reads every waiting datagram right before judging, and
  feeds the arrival times to the pure :class:`~failsoft.policies.detection.HeartbeatDetector`. A
  stalled controller thus delays the *check*, never the *evidence*.

Datagrams carry an HMAC-SHA256 tag with a per-cluster key (agents and controller get it from the
session), so nothing else on the network can forge one. A signature does not say *when* a datagram
was sent, so a recorded one could be sent again to keep a dead server "alive": each datagram also
carries its sidecar's tick number (``seq``), and the receiver accepts from each incarnation of a
server only numbers newer than the last it accepted (a replay is rejected and counted). Numbers
count ticks, sent or not, so a gap in them is a silence the sidecar chose (a stopped or wedged
agent), while consecutive numbers far apart mean the sidecar itself ran late.

The receiver never stops on its own: a transient socket error is logged, counted and skipped; a
socket that is gone (closed, not a socket any more) raises :class:`HeartbeatReceiverError` on every
drain, so that the controller fails loudly instead of seeing every server fall silent at once.
"""

from __future__ import annotations

import errno
import logging
import secrets
import socket
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from failsoft.errors import ServingError
from failsoft.runtime.pulse import parse

log = logging.getLogger(__name__)


def free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True, slots=True)
class HeartbeatEndpoint:
    """Where agents send heartbeats, and the key that signs them (made by the session)."""

    host: str
    port: int
    key: bytes = field(repr=False)

    @classmethod
    def make(cls, host: str) -> HeartbeatEndpoint:
        return cls(host, free_udp_port(host), secrets.token_bytes(32))


@dataclass(frozen=True, slots=True)
class Beat:
    server: str
    incarnation: str
    arrived: float  # monotonic seconds: when the controller's kernel received it
    seq: int = 0  # the sidecar's tick number, newer than any accepted before from this incarnation
    dead: bool = False  # the sidecar's death notice: the agent process died


class HeartbeatReceiverError(ServingError):
    """The heartbeat socket is gone: without it every server would look silent."""


class HeartbeatReceiver:
    """The controller's end: a non-blocking socket whose datagrams carry the kernel's arrival time.

    :meth:`drain` reads every datagram waiting in the socket and returns the latest beat of each
    server, stamped with the time the *kernel* received it (``SO_TIMESTAMPNS``), converted to the
    monotonic clock. A controller that stalls (a long plan, a busy machine) therefore reads true
    arrival times when it resumes: its stall is never mistaken for the servers' silence.

    Counters (for ``stats()``): ``received`` beats accepted, ``rejected`` datagrams refused (bad
    signature, unknown server or replayed), ``replayed`` of those refused for an old ``seq``,
    ``errors`` transient socket errors survived; ``max_gap_s`` per server, the longest time between
    two accepted beats, and ``skipped`` per server, ticks its sidecar did not send (or that were lost).
    """

    def __init__(self, endpoint: HeartbeatEndpoint, servers: set[str]) -> None:
        self.key, self.servers = endpoint.key, servers
        self.received = 0
        self.rejected = 0
        self.replayed = 0
        self.errors = 0
        self.max_gap_s: dict[str, float] = {}
        self.skipped: dict[str, int] = {}
        self._last_arrival: dict[str, float] = {}
        self._seqs: dict[str, OrderedDict[str, int]] = {}  # server -> incarnation -> last seq
        self._warned_at = float("-inf")
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self._kernel_stamps = False
        if SO_TIMESTAMPNS is not None:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self._kernel_stamps = True
            except OSError:  # not this kernel: read-time stamps (a stalled reader may then misjudge)
                log.warning("no kernel receive timestamps: heartbeats are stamped when read")
        self._sock.bind((endpoint.host, endpoint.port))
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()

    def close(self) -> None:
        self._sock.close()

    def drain(self) -> list[Beat]:
        """The latest beat of each server among the datagrams waiting now.

        Raises :class:`HeartbeatReceiverError` when the socket is gone (never silently nothing).
        """
        latest: dict[str, Beat] = {}
        wall_minus_mono = time.time() - time.monotonic()
        errors = 0
        while errors <= MAX_ERRORS_PER_DRAIN:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(512, _CMSG_SPACE)
            except BlockingIOError:  # nothing more waiting
                break
            except OSError as exc:
                self._on_error(exc)
                errors += 1
                continue
            arrived = _kernel_time(ancillary, wall_minus_mono) if self._kernel_stamps else time.monotonic()
            beat = self._accept(data, arrived)
            if beat is not None and (
                beat.server not in latest or latest[beat.server].arrived <= arrived or beat.dead
            ):
                latest[beat.server] = beat  # a death notice wins over the beats before it
        return list(latest.values())

    def _on_error(self, exc: OSError) -> None:
        """Survive a transient error (warn, count); raise if the socket itself is gone."""
        if self._sock.fileno() == -1 or exc.errno in GONE_ERRNOS:
            log.critical("heartbeat socket %s is gone: %s", self.address, exc)
            raise HeartbeatReceiverError(
                f"the heartbeat socket {self.address[0]}:{self.address[1]} is gone ({exc}): "
                "no server can be judged"
            ) from exc
        self.errors += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("heartbeat receiver: %s (%d transient errors so far); receiving on", exc, self.errors)

    def _accept(self, data: bytes, arrived: float) -> Beat | None:
        parsed = parse(self.key, data)
        if parsed is None or parsed[0] not in self.servers:
            self.rejected += 1
            return None
        server, incarnation, seq, dead = parsed
        seqs = self._seqs.setdefault(server, OrderedDict())
        last = seqs.get(incarnation)
        if last is not None and seq <= last:
            self.rejected += 1
            self.replayed += 1
            return None
        if last is not None and seq > last + 1:
            self.skipped[server] = self.skipped.get(server, 0) + seq - last - 1
        seqs[incarnation] = seq
        seqs.move_to_end(incarnation)
        while len(seqs) > INCARNATIONS_KEPT:
            seqs.popitem(last=False)
        previous = self._last_arrival.get(server)
        if previous is not None:
            self.max_gap_s[server] = max(self.max_gap_s.get(server, 0.0), arrived - previous)
        self._last_arrival[server] = max(arrived, previous or arrived)
        self.received += 1
        return Beat(server, incarnation, arrived, seq, dead)


RECEIVE_BUFFER_BYTES = 1 << 20
INCARNATIONS_KEPT = 8  # per server: replays of its last few incarnations are recognised too
MAX_ERRORS_PER_DRAIN = 16  # transient errors survived per drain before the rest waits for the next one
WARN_EVERY_S = 1.0
GONE_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})
# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS), which Python's socket module does not name.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def _kernel_time(ancillary: list[tuple[int, int, bytes]], wall_minus_mono: float) -> float:
    """The kernel's receive time (wall clock) of a datagram, on the monotonic clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanos = _TIMESPEC.unpack(data[: _TIMESPEC.size])
            return seconds + nanos / 1e9 - wall_minus_mono
    return time.monotonic()
