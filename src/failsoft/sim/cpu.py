"""A host's cores shared by the work of the servers on it: Linux's fair scheduler, as a fluid model.

On an embedded cluster (``failsoft serve`` on one machine) every agent process, and every load and
inference inside it, runs on the same few cores. Profiles are measured with nothing else running,
so when two loads and an inference overlap on a 2-core machine each takes longer than its profile.
:class:`SharedCPU` models this as weighted processor sharing: each job is single-threaded (the
runtime gives torch one thread per agent), so it runs at most at one core's speed; the cores are
divided among running jobs in proportion to their CFS weights, the weight of the ``nice`` value the
runtime runs them at (inference 0, recovery loads 5, background loads 15), capped at one core each
with the rest shared among the others (water-filling). Rates are recomputed whenever a job starts,
ends or is cancelled; between those moments they are constant, so one SimPy timeout per change
suffices.

Everything else the host runs (the gateway, the controller, Ray, client processes, the steady
inference of unaffected apps, other tenants) is ``busy_cores`` of *background demand*, measured on
the real host: ``ceil(busy_cores)`` endless jobs at nice 0, each wanting at most its share of
``busy_cores``. They take their part of the cores by the same weights, so a recovery load at nice 5
on a host already 1.5 cores busy gets far less than the free half core it would get if the
background were served first.

Not modelled: the interpreter lock inside one agent process, memory bandwidth, caches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import simpy

_EPS = 1e-9


def cfs_weight(nice: int) -> float:
    """Linux CFS's load weight of a nice value (kernel/sched/core.c: 1024 at 0, x1.25 a step)."""
    return 1024.0 / 1.25**nice


@dataclass
class _Job:
    remaining_s: float  # work left, in seconds of one core
    weight: float
    owner: str
    done: simpy.Event
    rate: float = 0.0
    cap: float = 1.0  # at most this many cores (one: a single-threaded job)


class SharedCPU:
    """``cores`` cores shared by single-threaded jobs in proportion to their CFS weights, beside
    ``busy_cores`` of background demand (see the module docstring)."""

    def __init__(self, env: simpy.Environment, cores: float, busy_cores: float = 0.0) -> None:
        if cores <= 0:
            raise ValueError(f"cores must be positive; got {cores!r}")
        if not 0 <= busy_cores <= cores:
            raise ValueError(f"busy_cores must be in [0, cores={cores}]; got {busy_cores!r}")
        self.env, self.cores = env, cores
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._at = env.now  # when the jobs' remaining work was last brought up to date
        self._generation = 0
        self._background: list[_Job] = []
        if busy_cores > 0:
            n = math.ceil(busy_cores)
            self._background = [
                _Job(math.inf, cfs_weight(0), "", env.event(), cap=busy_cores / n) for _ in range(n)
            ]
            self._share()

    @property
    def running(self) -> int:
        return len(self._jobs)

    @property
    def background_rate(self) -> float:
        """The cores the background gets now (its demand when the jobs leave it room)."""
        return sum(j.rate for j in self._background)

    def run(self, work_s: float, nice: int = 0, owner: str = "") -> Generator[simpy.Event, Any, bool]:
        """Process: do ``work_s`` seconds of one core's work; True when done, False if cancelled."""
        if work_s <= 0:
            return True
        key = next(self._ids)
        job = _Job(work_s, cfs_weight(nice), owner, self.env.event())
        self._advance()
        self._jobs[key] = job
        self._reschedule()
        try:
            return (yield job.done)
        except simpy.Interrupt:
            if key in self._jobs:  # its process was stopped: the work stops with it
                self._advance()
                del self._jobs[key]
                self._reschedule()
            raise

    def cancel(self, owner: str) -> None:
        """Stop every job of ``owner`` (its server crashed); their processes see False."""
        self._advance()
        for key in [k for k, j in self._jobs.items() if j.owner == owner]:
            self._jobs.pop(key).done.succeed(False)
        self._reschedule()

    # the fluid model --------------------------------------------------------------------------------
    def _advance(self) -> None:
        elapsed = self.env.now - self._at
        self._at = self.env.now
        if elapsed <= 0:
            return
        for job in self._jobs.values():
            job.remaining_s -= job.rate * elapsed

    def _reschedule(self) -> None:
        for key in [k for k, j in self._jobs.items() if j.remaining_s <= _EPS]:
            self._jobs.pop(key).done.succeed(True)
        self._share()
        self._generation += 1
        running = [j.remaining_s / j.rate for j in self._jobs.values() if j.rate > 0]
        if running:
            self.env.process(self._tick(min(running), self._generation))

    def _share(self) -> None:
        """Water-filling: shares by weight, each capped (one core, or a background job's demand),
        what a capped job leaves to the others."""
        pool = sorted([*self._jobs.values(), *self._background], key=lambda j: j.cap / j.weight)
        cores = self.cores
        while pool:
            total = sum(j.weight for j in pool)
            first = pool[0]  # the one that reaches its cap at the lowest share
            if cores * first.weight / total >= first.cap:
                first.rate = first.cap
                cores -= first.cap
                pool.pop(0)
                if cores <= _EPS:
                    for job in pool:
                        job.rate = 0.0
                    return
                continue
            for job in pool:
                job.rate = cores * job.weight / total
            return

    def _tick(self, delay_s: float, generation: int) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(max(delay_s, 0.0))
        if generation == self._generation:  # no start, end or cancel since it was set
            self._advance()
            self._reschedule()
