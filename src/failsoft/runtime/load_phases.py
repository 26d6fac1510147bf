"""Where a model load's time goes, phase by phase, in the threads that run it.

On a shared host a load's wall time is its CPU work plus two kinds of waiting, which call for
different remedies: *runnable* (ready to run, waiting for a core: the host's other work, the CPU
priority it runs at) and *blocked* (not runnable: waiting for the interpreter lock another thread of
the agent holds, for the disk, for a lock). The thread's CPU clock counts the first, Linux counts
the second per thread (``/proc/thread-self/schedstat``: nanoseconds waiting on a run queue), so
each phase is reported as ``wall_ms`` = ``cpu_ms`` + ``runnable_ms`` + ``blocked_ms``. Where the
kernel does not count run-queue waits (no schedstats, not Linux), the two waits are ``None``.

A phase is timed in the thread it runs in (:meth:`LoadPhases.phase`); the agent's load runs some
phases in Ray's thread and some in a thread of lower priority, and :meth:`LoadPhases.gap` times the
hand-over between them (wall time only). :meth:`LoadPhases.report` is what the agent returns with a
load, under ``phases``; the controller adds the stamps of its own call (``sent_at``,
``returned_at``, wall clock: the agent's stamps are on the same host's clock).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def thread_times() -> tuple[float, float | None]:
    """This thread's (CPU seconds, run-queue seconds); the second is None where not counted.

    The CPU time is the thread's clock (exact when read; the kernel's schedstat on-CPU count lags
    by up to a tick), the run-queue time the kernel's count (exact while the thread runs: a wait
    is added when it ends)."""
    cpu = time.thread_time()
    try:
        return cpu, int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu, None


class LoadPhases:
    """The phases of one load: each one's wall, CPU, runnable and blocked milliseconds."""

    def __init__(self) -> None:
        self.entered_at = time.time()  # wall clock: comparable with the controller's stamps
        self.phases: dict[str, dict[str, float | None]] = {}
        self.notes: dict[str, str] = {}  # how the load went, beside its timings (e.g. ``skeleton``)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name``, in the calling thread."""
        wall = time.perf_counter()
        cpu, runnable = thread_times()
        try:
            yield
        finally:
            wall_s = time.perf_counter() - wall
            cpu_end, runnable_end = thread_times()
            waited = None if runnable is None or runnable_end is None else runnable_end - runnable
            self.phases[name] = split_ms(wall_s, cpu_end - cpu, waited)

    def gap(self, name: str, since: float) -> None:
        """A phase of wall time only, from ``since`` (``time.perf_counter``) to now: a hand-over
        between threads (a thread's start and first turn on a core)."""
        self.phases[name] = {"wall_ms": _ms(time.perf_counter() - since)}

    def note(self, name: str, value: str) -> None:
        """Record ``name``: ``value`` in the report (not a phase: a fact about how the load went)."""
        self.notes[name] = value

    def cpu_ms(self, *names: str) -> float:
        """The CPU the phases ``names`` took (those timed), summed."""
        return sum(self.phases.get(name, {}).get("cpu_ms") or 0.0 for name in names)

    def report(self) -> dict[str, Any]:
        """The phases, in the order they ran, the agent's entry and exit stamps (wall clock), and
        the notes."""
        return {"entered_at": self.entered_at, "left_at": time.time(), **self.phases, **self.notes}


def split_ms(wall_s: float, cpu_s: float, runnable_s: float | None) -> dict[str, float | None]:
    """One phase's milliseconds: wall = cpu + runnable + blocked (the rest, never below 0)."""
    blocked = None if runnable_s is None else max(wall_s - cpu_s - runnable_s, 0.0)
    return {
        "wall_ms": _ms(wall_s),
        "cpu_ms": _ms(cpu_s),
        "runnable_ms": None if runnable_s is None else _ms(runnable_s),
        "blocked_ms": None if blocked is None else _ms(blocked),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


AGENT_PHASES = ("reserve", "start", "read", "warm_up", "serving_queue")


def timeline(phases: dict[str, Any], detected_at: float, mttr_ms: float) -> dict[str, Any]:
    """A recovery's MTTR cut at the stamps of its first load (``phases`` as the driver and the agent
    recorded them, ``detected_at`` in wall-clock seconds), in consecutive segments that add up to
    ``mttr_ms``: ``plan_wait_ms`` (detection to the plan asked for: the wait for correlated
    failures, the controller's loop), ``plan_ms`` (the failover policy), ``slot_wait_ms`` (the plan
    made to the load sent: a load slot), ``call_ms`` (sent to the agent's method running: Ray's
    call, the agent's threads), ``agent_ms`` (in the agent; its phases under ``agent``),
    ``reply_ms`` (the answer's way back) and ``route_ms`` (the rest: the controller, to the route
    set). A segment whose end was not stamped is None, and the next one spans it. ``skeleton``:
    whether the load took a skeleton prepared ahead (``prepared``) or built one (``built``)."""

    def at(name: str) -> float | None:
        value = phases.get(name)
        return float(value) if isinstance(value, int | float) else None

    marks = [
        ("plan_wait_ms", at("plan_asked_at")),
        ("plan_ms", at("plan_done_at")),
        ("slot_wait_ms", at("issued_at")),
        ("call_ms", at("entered_at")),
        ("agent_ms", at("left_at")),
        ("reply_ms", at("returned_at")),
    ]
    plan_done = at("plan_done_at")
    if plan_done is not None and (at("issued_at") or 0.0) < plan_done:  # a load of an earlier plan
        marks = marks[2:]
    out: dict[str, Any] = {}
    last = detected_at
    for name, mark in marks:
        out[name] = None if mark is None else _ms(mark - last)
        last = mark if mark is not None else last
    out["route_ms"] = round(mttr_ms - (last - detected_at) * 1000.0, 3)
    out["agent"] = {name: phases[name] for name in AGENT_PHASES if isinstance(phases.get(name), dict)}
    if isinstance(phases.get("skeleton"), str):  # the agent's note: prepared ahead, or built in the load
        out["skeleton"] = phases["skeleton"]
    return out
