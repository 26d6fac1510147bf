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
session), so nothing else on the network can keep a dead server "alive".
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

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


class HeartbeatReceiver:
    """The controller's end: a non-blocking socket whose datagrams carry the kernel's arrival time.

    :meth:`drain` reads every datagram waiting in the socket and returns the latest beat of each
    server, stamped with the time the *kernel* received it (``SO_TIMESTAMPNS``), converted to the
    monotonic clock. A controller that stalls (a long plan, a busy machine) therefore reads true
    arrival times when it resumes: its stall is never mistaken for the servers' silence.
    """

    def __init__(self, endpoint: HeartbeatEndpoint, servers: set[str]) -> None:
        self.key, self.servers = endpoint.key, servers
        self.received = 0
        self.rejected = 0
        self.max_gap_s: dict[str, float] = {}
        self._last_arrival: dict[str, float] = {}
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

    def close(self) -> None:
        self._sock.close()

    def drain(self) -> list[Beat]:
        """The latest beat of each server among the datagrams waiting now."""
        latest: dict[str, Beat] = {}
        wall_minus_mono = time.time() - time.monotonic()
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(512, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            arrived = _kernel_time(ancillary, wall_minus_mono) if self._kernel_stamps else time.monotonic()
            beat = self._parse(data, arrived)
            if beat is None:
                self.rejected += 1
                continue
            previous = self._last_arrival.get(beat.server)
            if previous is not None:
                self.max_gap_s[beat.server] = max(self.max_gap_s.get(beat.server, 0.0), arrived - previous)
            self._last_arrival[beat.server] = max(arrived, previous or arrived)
            if beat.server not in latest or latest[beat.server].arrived <= arrived:
                latest[beat.server] = beat
            self.received += 1
        return list(latest.values())

    def _parse(self, data: bytes, arrived: float) -> Beat | None:
        parsed = parse(self.key, data)
        if parsed is None or parsed[0] not in self.servers:
            return None
        return Beat(parsed[0], parsed[1], arrived)


RECEIVE_BUFFER_BYTES = 1 << 20
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
