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

Other scheduling groups. Where the kernel schedules by *autogroup* (one group per session, on by
default on desktop kernels), CPU is shared between groups first, equally, and by ``nice`` only
inside a group. Every process of an embedded cluster is in the session that started it; another
tenant's job in its own session takes a group's share, not a nice-0 thread's. ``other_groups``
gives each other group's measured busy cores: the cores are first water-filled between the
cluster's group (its jobs and its own background) and those groups, with equal weights, each
capped at its demand; the cluster's part is then shared among its jobs by CFS weights as above.

A measured share instead. Busy cores say how much ran, not how hard it competed: a gateway waking
every millisecond, a thread waiting for the interpreter lock, a tenant's burst all take more from a
low-priority load than their average suggests. Where the share of a core a thread at the loads'
priority actually got was measured on the real host (the agents' ``load_cpu_share`` probe),
:func:`equivalent_competitors` turns it into ``competitors``: that many always-runnable nice-0
threads, the number beside which one such thread gets exactly the measured share. The background
is then those competitors (instead of ``busy_cores`` and ``other_groups``), and every load,
warm-up and first answer of the recovery shares the cores with them and with each other by weight.

Short jobs that wake ahead. A thread that slept (the controller's call handler, Ray's RPC thread,
the agent's pick-up) and wakes for a few milliseconds of work is run by the kernel ahead of threads
that have been running for a long time, whatever their ``nice``: it has no run time to pay back,
and the fair scheduler lets it preempt. A fluid share would instead stretch such a job as much as a
long load. ``run(..., ahead=True)`` serves a job before all the others: the jobs ahead share the
(cluster's) cores among themselves by weight, one core each at most, and the other jobs and the
background share what they leave. Only the control path's work is run so (``SimConfig.control_ahead``).

Not modelled: the interpreter lock inside one agent process, memory bandwidth, caches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import simpy

from failsoft.orchestration.loads import LOAD_NICE

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
    ahead: bool = False  # served before the other jobs (a short job that woke: module docstring)


class SharedCPU:
    """``cores`` cores shared by single-threaded jobs in proportion to their CFS weights, beside a
    background: ``busy_cores`` of demand (and ``other_groups``), or ``competitors`` always-runnable
    nice-0 threads (see the module docstring)."""

    def __init__(
        self,
        env: simpy.Environment,
        cores: float,
        busy_cores: float = 0.0,
        other_groups: tuple[float, ...] = (),
        competitors: float = 0.0,
    ) -> None:
        if cores <= 0:
            raise ValueError(f"cores must be positive; got {cores!r}")
        if not 0 <= busy_cores <= cores:
            raise ValueError(f"busy_cores must be in [0, cores={cores}]; got {busy_cores!r}")
        if any(not 0 <= g <= cores for g in other_groups) or busy_cores + sum(other_groups) > cores + 1e-6:
            raise ValueError(
                f"other_groups must each be in [0, cores={cores}] and, with busy_cores, sum to at most "
                f"the cores; got {other_groups!r} beside {busy_cores!r}"
            )
        self.env, self.cores = env, cores
        # other scheduling groups, and the cluster's own, as jobs of equal weight capped at demand
        self._groups = [_Job(math.inf, 1.0, "", env.event(), cap=g) for g in other_groups if g > 0]
        self._cluster = _Job(math.inf, 1.0, "", env.event())
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._at = env.now  # when the jobs' remaining work was last brought up to date
        self._generation = 0
        if competitors < 0 or (competitors > 0 and (busy_cores > 0 or other_groups)):
            raise ValueError(
                f"competitors must be zero or positive, and alone (no busy_cores or other_groups); got "
                f"{competitors!r}"
            )
        self._background: list[_Job] = []
        if competitors > 0:
            self._background = [_competitors(env, competitors, cores)]
        if busy_cores > 0:
            n = math.ceil(busy_cores)
            self._background = [
                _Job(math.inf, cfs_weight(0), "", env.event(), cap=busy_cores / n) for _ in range(n)
            ]
        if self._background:
            self._share()

    @property
    def running(self) -> int:
        return len(self._jobs)

    @property
    def background_rate(self) -> float:
        """The cores the background gets now (its demand when the jobs leave it room)."""
        return sum(j.rate for j in self._background)

    def run(
        self, work_s: float, nice: int = 0, owner: str = "", ahead: bool = False
    ) -> Generator[simpy.Event, Any, bool]:
        """Process: do ``work_s`` seconds of one core's work; True when done, False if cancelled.
        ``ahead``: served before the jobs not ahead (a short job that woke; module docstring)."""
        if work_s <= 0:
            return True
        key = next(self._ids)
        job = _Job(work_s, cfs_weight(nice), owner, self.env.event(), ahead=ahead)
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
        """The cluster's group's cores (all of them without other groups), shared among its jobs:
        first among those ahead, then what they leave among the others."""
        own = [*self._jobs.values(), *self._background]
        cores = self.cores
        if self._groups:
            self._cluster.cap = min(sum(j.cap for j in own), self.cores)
            _water_fill([self._cluster, *self._groups], self.cores)
            cores = self._cluster.rate
        ahead = [j for j in own if j.ahead]
        if ahead:
            _water_fill(ahead, cores)
            cores = max(cores - sum(j.rate for j in ahead), 0.0)
            own = [j for j in own if not j.ahead]
        _water_fill(own, cores)

    def _tick(self, delay_s: float, generation: int) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(max(delay_s, 0.0))
        if generation == self._generation:  # no start, end or cancel since it was set
            self._advance()
            self._reschedule()


def _competitors(env: simpy.Environment, n: float, cores: float) -> _Job:
    """``n`` always-runnable nice-0 threads as one job: ``n`` times the weight, at most ``n`` cores."""
    return _Job(math.inf, n * cfs_weight(0), "", env.event(), cap=min(n, cores))


def equivalent_competitors(cores: float, share: float, nice: int = LOAD_NICE) -> float:
    """How many always-runnable nice-0 threads leave one thread at ``nice`` exactly ``share`` of a
    core on ``cores`` cores (0 when it gets a whole core, or all it can, anyway)."""
    if share <= 0:
        raise ValueError(f"share must be positive; got {share!r}")
    env = simpy.Environment()

    def alone(n: float) -> float:
        job = _Job(1.0, cfs_weight(nice), "", env.event())
        _water_fill([job, _competitors(env, n, cores)] if n > 0 else [job], cores)
        return job.rate

    if share >= alone(0.0) - 1e-6:
        return 0.0
    low, high = 0.0, 1.0
    while alone(high) > share:  # the rate falls without bound as competitors are added
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if alone(mid) > share else (low, mid)
    return (low + high) / 2


def _water_fill(jobs: list[_Job], cores: float) -> None:
    """Shares of ``cores`` by weight, each capped (one core, or a background job's demand), what a
    capped job leaves to the others; sets each job's rate."""
    pool = sorted(jobs, key=lambda j: j.cap / j.weight)
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
