"""Work an agent puts off until no recovery waits on it: one thread, at the lowest priority.

A recovery load ends with its first answer: the app's route is published then, and what a load
used to do before returning that the first answer does not need (warm-up inferences at the other
batch sizes) is done here, after. So is the preparation of module skeletons for loads that may come
(:mod:`failsoft.zoo.skeletons`). Both are CPU work that must never slow a recovery, so:

* one thread runs them, one task at a time, in the order they were submitted;
* it runs ``nice`` steps below the agent (the background loads' priority): answers and recovery
  loads get the cores first;
* a task starts no earlier than ``settle_s`` after it was submitted (the load's reply and the
  route's publication go first: milliseconds), and only while ``busy()`` is False (no recovery
  load runs in this agent); it then waits, polling every ``poll_s``.

A task that fails is logged and counted; the thread goes on. :meth:`Deferred.drain` waits until
nothing is queued or running (tests, benchmarks).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from failsoft.errors import ConfigError
from failsoft.runtime.priority import lower_niceness
from failsoft.runtime.serving import ServingQueue

log = logging.getLogger(__name__)
_Task = tuple[float, str, Callable[..., Any], tuple[Any, ...]]  # (not before, kind, function, args)
SETTLE_S = 0.05  # a task waits this long after its submission: the reply and the route go first
POLL_S = 0.02  # how often a waiting task looks whether the recovery loads are done


class Deferred:
    """A queue of deferred tasks and the low-priority thread that runs them. Thread-safe."""

    def __init__(
        self,
        name: str,
        busy: Callable[[], bool],
        nice: int,
        settle_s: float = SETTLE_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.name = name
        self._busy = busy
        self._nice = nice
        self._settle_s = settle_s
        self._poll_s = poll_s
        self._tasks: queue.Queue[_Task | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self.done: dict[str, int] = {}  # tasks run, by kind
        self.started_at: dict[str, float] = {}  # when the last task of each kind started (wall clock)
        self.failed = 0

    def submit(self, kind: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` later, in the deferred thread; ``kind`` names it in :meth:`stats`."""
        with self._lock:
            self._pending += 1
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"deferred-{self.name}", daemon=True)
                self._thread.start()
        self._tasks.put((time.monotonic() + self._settle_s, kind, fn, args))

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted task has run; False at ``timeout_s``."""
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Stop the thread after the task it runs (the queued ones are dropped)."""
        self._tasks.put(None)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pending": self._pending,
                "done": dict(self.done),
                "failed": self.failed,
                "started_at": dict(self.started_at),
            }

    def _run(self) -> None:
        lower_niceness(self._nice)
        while (task := self._tasks.get()) is not None:
            not_before, kind, fn, args = task
            while time.monotonic() < not_before or self._busy():
                time.sleep(self._poll_s)
            self.started_at[kind] = time.time()
            try:
                fn(*args)
                failed = False
            except Exception:
                log.exception("%s: deferred %s failed", self.name, kind)
                failed = True
            with self._lock:
                self._pending -= 1
                self.failed += failed
                if not failed:
                    self.done[kind] = self.done.get(kind, 0) + 1
                if self._pending == 0:
                    self._idle.set()


def warm_rest(model: Any, queue: ServingQueue, sizes: Sequence[int]) -> None:
    """A recovery load's warm-up after its first answer: ``sizes`` (batch sizes, in order) answered
    with zeros, then the queue calibrated to them unless real batches already did
    (:meth:`ServingQueue.warmed`). It stops when the model is unloaded meanwhile.

    On the CPU each call is timed as the smaller of its wall and this thread's CPU time: at the
    lowest priority on a busy host the wall time is mostly waiting for a core, which the queue must
    not learn as the model's speed (with one torch thread per agent, the CPU time is the compute).
    On a GPU the compute is the device's, so the wall time is taken."""
    timings = []
    for rows in sizes:
        if queue.closed:
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            model.predict(np.zeros((rows, *model.input_shape), dtype=np.float32))
        except ConfigError:  # closed (unloaded) under us
            return
        wall_s, cpu_s = time.perf_counter() - wall, time.thread_time() - cpu
        ms = (wall_s if str(model.device).startswith("cuda") else min(wall_s, cpu_s)) * 1000.0
        timings.append((rows, ms))
    queue.warmed(timings)
