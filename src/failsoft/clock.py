"""Injected time: the same detectors and timers run on wall-clock time and on simulated time.

Runtime code takes a :class:`Clock` and never calls ``time.monotonic`` itself; the simulator passes
a clock reading SimPy's ``env.now``; tests pass a :class:`ManualClock` they advance by hand.
Times are seconds as floats.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line (the origin is arbitrary)."""
        ...


class MonotonicClock:
    """Wall-clock time for the runtime."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: for deterministic tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds
        return self._now
