"""Injected time: the same detectors, timers and routers run on wall-clock, simulated and manual time.

Code that needs time takes a :class:`Clock` and never calls ``time.monotonic`` or ``asyncio.sleep``
itself. Three clocks exist:

* :class:`MonotonicClock`: the runtime's (``time.monotonic``, ``asyncio.sleep``);
* :class:`~failsoft.sim.clock.SimClock`: the simulator's, reading SimPy's ``env.now`` (SimPy
  processes wait on SimPy events, so it has no ``sleep``: sans-I/O code takes ``now`` and asks for
  wake-ups instead of sleeping);
* :class:`ManualClock`: tests', which moves only when told to. Its ``sleep`` parks a coroutine until
  :meth:`ManualClock.advance` passes its wake-up time, so an asyncio component (the router, the
  controller's loop) can be unit-tested in virtual time, deterministically and without waiting.

Times are seconds as floats.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Collection
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line (the origin is arbitrary)."""
        ...


@runtime_checkable
class AsyncClock(Clock, Protocol):
    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once for 0 or less)."""
        ...


class MonotonicClock:
    """Wall-clock time for the runtime."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class ManualClock:
    """A clock that moves only when told to: for deterministic tests, sync or async."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    def advance(self, seconds: float) -> float:
        """Move time forward and wake every sleeper whose time has come (they run at the next
        scheduling point of the event loop: ``await asyncio.sleep(0)``, or use :meth:`run_for`)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now + 1e-12:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        return self._now

    @property
    def next_wakeup(self) -> float | None:
        """When the earliest parked sleeper wakes, or None."""
        while self._sleepers and self._sleepers[0][2].done():  # cancelled sleepers
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def run_for(self, seconds: float) -> None:
        """Advance ``seconds`` in virtual time, stopping at every wake-up on the way so that each
        woken coroutine runs (and may sleep again) before time moves on."""
        end = self._now + seconds
        await _settle()
        while (wake := self.next_wakeup) is not None and wake <= end:
            self.advance(max(wake - self._now, 0.0))
            await _settle()
        self.advance(max(end - self._now, 0.0))
        await _settle()


async def _settle(rounds: int = 20) -> None:
    """Let ready coroutines run: a few passes of the event loop."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def wait_all(clock: AsyncClock, tasks: Collection[asyncio.Future[Any]], timeout_s: float) -> bool:
    """Wait until every task is done or ``timeout_s`` has passed on ``clock``; True if all are done.

    ``asyncio.wait(..., timeout=)`` would time out on the event loop's own clock, which a test's
    manual clock does not move.
    """
    pending = set(tasks)
    if not pending:
        return True
    timer = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        while pending and not timer.done():
            _, pending = await asyncio.wait(pending | {timer}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(timer)
    finally:
        timer.cancel()
    return not pending
