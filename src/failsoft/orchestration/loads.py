"""Per-server load slots with priorities: which load starts first when a failover needs many.

FailLite's progressive failover (3.3) serves every recovered app as soon as possible on a small
variant, then upgrades in the background. On a server receiving many apps, the order of loads is
therefore part of the MTTR: a :class:`LoadQueue` lets at most ``slots`` loads run at once per server
and starts waiting loads by priority (lowest first), then shortest first (the profiled ``load_ms``),
then by arrival: the first variants of critical apps go before the others, upgrades last, and among
the loads of one priority the shortest first, which makes the mean time to recovery of several
apps waiting for one server's slots the smallest it can be (shortest processing time first: a
long load ahead of short ones delays each of them by its whole length). The core submits a
failover plan's loads in that order too (:func:`recovery_order`), so that the loads that start at
once, in the free slots, are the shortest, not the plan's first.

Slots count loads, but a load's cost to the host is its CPU work: of the ``slots``, at most
``heavy_slots`` run *heavy* loads (profiled work of at least :data:`SMALL_LOAD_MS`) at once, which
:func:`heavy_load_slots` derives from the cores the host leaves to loads. On a host whose cores
serving and control already take (two cores: one is the answers', the gateway's and Ray's), two
heavy loads at once each run at half speed and both end late, where one after the other ends the
first at its own speed and the second no later; small loads, a few milliseconds of work, still take
the other slots beside a heavy one (held behind it, they would wait its whole length). Where the
servers share one host (an embedded cluster: ``heavy_per_host``), the heavy slots are the host's:
at most ``heavy_slots`` heavy loads at once over all its servers, for the same reason (two servers'
heavy loads share the same cores); a heavy slot freed on one server may start another's load.

It is pure bookkeeping (the core asks it which loads may start; the driver runs them), so the
runtime and the simulator queue loads identically.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum

from failsoft.domain import Variant

# The CPU priorities (nice values) the runtime's agents run work at, and the simulator's shared CPU
# models: inference first, then the loads that recover apps, background loads (upgrades, warm backups)
# last, so that answers of recovered apps come first on a busy machine.
INFERENCE_NICE = 0
LOAD_NICE = 5
BACKGROUND_NICE = 15
# ... except a recovery load whose work is shorter than this: it runs at the inference priority (in
# the agent's own thread), because at a lower one it would wait for its turn among busier threads
# far longer than it works. Measured on a busy 2-core host (examples/fidelity.yaml, a server killed):
# cnn_xs's load, 3-5 ms of CPU, took 47-57 ms at nice 5 and 10-24 ms at the agent's own priority;
# a load this small takes nothing worth protecting from the answers it would delay.
SMALL_LOAD_MS = 20.0


def load_nice(variant: Variant, background: bool = False) -> int:
    """The CPU priority a load of ``variant`` runs at: background loads (upgrades, warm backups)
    last, recovery loads below inference unless their profiled work is under ``SMALL_LOAD_MS``
    (``Variant.load_work_ms``)."""
    if background:
        return BACKGROUND_NICE
    return INFERENCE_NICE if variant.load_work_ms < SMALL_LOAD_MS else LOAD_NICE


class Priority(IntEnum):
    CRITICAL = 0  # first (or cold) variant of a critical app's failover
    FAILOVER = 1  # first (or cold) variant of any other app's failover; repairs
    PRIMARY = 2  # deploy, return home
    WARM = 3  # warm backups
    UPGRADE = 4  # progressive upgrades to the final variant


def is_heavy(variant: Variant) -> bool:
    """Whether a load of ``variant`` takes one of a server's heavy slots (:class:`LoadQueue`)."""
    return variant.load_work_ms >= SMALL_LOAD_MS


def heavy_load_slots(cores: float, reserved_cores: float = 1.0) -> int:
    """How many heavy loads one server runs at once: one per whole core left once
    ``reserved_cores`` (the answers, the gateway, the controller, Ray) are set aside, at least one.
    A load is single-threaded CPU work: past the free cores, loads at once only share them."""
    if cores <= 0 or reserved_cores < 0:
        raise ValueError(f"cores must be positive, the reserve not negative: {cores}, {reserved_cores}")
    return max(1, int(cores - reserved_cores + 1e-9))


class LoadQueue:
    """Load slots of every server: admitted loads, and waiting ones by (priority, load_ms, arrival);
    at most ``heavy_slots`` of a server's ``slots`` run heavy loads (default: all of them), or of
    all servers' together with ``heavy_per_host`` (they share one host's cores)."""

    def __init__(
        self, servers: list[str], slots: int, heavy_slots: int | None = None, heavy_per_host: bool = False
    ) -> None:
        if slots < 1:
            raise ValueError(f"a server needs at least one load slot, got {slots}")
        if heavy_slots is not None and heavy_slots < 1:
            raise ValueError(f"a server needs at least one slot for heavy loads, got {heavy_slots}")
        self.slots = slots
        self.heavy_slots = slots if heavy_slots is None else min(heavy_slots, slots)
        self.heavy_per_host = heavy_per_host and heavy_slots is not None  # (no limit: nothing to share)
        self._running: dict[str, set[int]] = {s: set() for s in servers}
        self._heavy: dict[str, set[int]] = {s: set() for s in servers}
        self._waiting: dict[str, list[tuple[int, float, int, int, bool]]] = {s: [] for s in servers}
        self._server_of: dict[int, str] = {}
        self._arrival = itertools.count()

    def submit(
        self, server: str, load_id: int, priority: int, load_ms: float = 0.0, heavy: bool = False
    ) -> bool:
        """Queue a load of about ``load_ms`` (its profile's), ``heavy`` or not; True when it may
        start now. (No waiting load could start before this call: only this one can now.)"""
        self._server_of[load_id] = server
        if self._fits(server, heavy):  # (any waiting load is a heavy one held back, or none waits)
            self._start(server, load_id, heavy)
            return True
        heapq.heappush(self._waiting[server], (priority, load_ms, next(self._arrival), load_id, heavy))
        return False

    def finish(self, load_id: int) -> list[int]:
        """A load ended (or was withdrawn): the loads that may start now on its server."""
        server = self._server_of.pop(load_id, None)
        if server is None:
            return []
        running, waiting = self._running[server], self._waiting[server]
        if load_id in running:
            running.discard(load_id)
            was_heavy = load_id in self._heavy[server]
            self._heavy[server].discard(load_id)
        else:  # withdrawn while waiting
            self._waiting[server] = [w for w in waiting if w[3] != load_id]
            heapq.heapify(self._waiting[server])
            return []
        started = self._start_waiting(server)
        if self.heavy_per_host and was_heavy:  # the host's heavy slot may start another's load
            for other in sorted(self._waiting, key=lambda s: self._waiting[s][:1]):
                if other != server:
                    started += self._start_waiting(other)
        return started

    def admit(self) -> list[int]:
        """Start what may start on every server (after :meth:`clear` freed the host's heavy slots)."""
        return [load_id for server in sorted(self._waiting) for load_id in self._start_waiting(server)]

    def _start_waiting(self, server: str) -> list[int]:
        """Start what may start of ``server``'s waiting loads, in their order; their ids."""
        running, waiting = self._running[server], self._waiting[server]
        started, held = [], []
        while waiting and len(running) < self.slots:
            entry = heapq.heappop(waiting)
            if self._fits(server, entry[4]):
                self._start(server, entry[3], entry[4])
                started.append(entry[3])
            else:  # a heavy load while the heavy slots are taken: the next may be a small one
                held.append(entry)
        for entry in held:
            heapq.heappush(waiting, entry)
        return started

    def clear(self, server: str) -> list[int]:
        """The server failed: forget its loads (running and waiting); their ids."""
        gone = list(self._running[server]) + [w[3] for w in self._waiting[server]]
        self._running[server] = set()
        self._heavy[server] = set()
        self._waiting[server] = []
        for load_id in gone:
            self._server_of.pop(load_id, None)
        return gone

    def _fits(self, server: str, heavy: bool) -> bool:
        return len(self._running[server]) < self.slots and (
            not heavy or self._heavy_running(server) < self.heavy_slots
        )

    def _heavy_running(self, server: str) -> int:
        """Heavy loads running that count against ``server``'s heavy slots."""
        if self.heavy_per_host:
            return sum(len(h) for h in self._heavy.values())
        return len(self._heavy[server])

    def _start(self, server: str, load_id: int, heavy: bool) -> None:
        self._running[server].add(load_id)
        if heavy:
            self._heavy[server].add(load_id)

    def running(self, server: str) -> int:
        return len(self._running[server])

    def waiting(self, server: str) -> int:
        return len(self._waiting[server])


def shortest_first_finish_ms(loads_ms: list[float], slots: int) -> list[float]:
    """When each load ends if they all start waiting at 0 on ``slots`` slots, shortest first, each
    taking its time in isolation: the ideal recovery times of apps failed over to one server (their
    mean is the smallest any order gives). Returned in the order of ``loads_ms``."""
    if slots < 1:
        raise ValueError(f"a server needs at least one load slot, got {slots}")
    free = [0.0] * slots
    ends = [0.0] * len(loads_ms)
    for i in sorted(range(len(loads_ms)), key=lambda i: (loads_ms[i], i)):
        start = heapq.heappop(free)
        ends[i] = start + loads_ms[i]
        heapq.heappush(free, ends[i])
    return ends
