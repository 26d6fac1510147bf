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

Not modelled: the interpreter lock inside one agent process, memory bandwidth, caches.
"""

from __future__ import annotations

import itertools
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


class SharedCPU:
    """``cores`` cores shared by single-threaded jobs in proportion to their CFS weights."""

    def __init__(self, env: simpy.Environment, cores: float) -> None:
        if cores <= 0:
            raise ValueError(f"cores must be positive; got {cores!r}")
        self.env, self.cores = env, cores
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._at = env.now  # when the jobs' remaining work was last brought up to date
        self._generation = 0

    @property
    def running(self) -> int:
        return len(self._jobs)

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
        if self._jobs:
            soonest = min(j.remaining_s / j.rate for j in self._jobs.values() if j.rate > 0)
            self.env.process(self._tick(soonest, self._generation))

    def _share(self) -> None:
        """Water-filling: shares by weight, capped at one core, the surplus to the others."""
        pool = sorted(self._jobs.values(), key=lambda j: j.weight, reverse=True)
        cores = self.cores
        while pool:
            total = sum(j.weight for j in pool)
            heaviest = pool[0]
            if cores * heaviest.weight / total >= 1.0:
                heaviest.rate = 1.0
                cores -= 1.0
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
