"""Simulated time for the shared detectors and timers.

The runtime hands its components a :class:`~failsoft.clock.MonotonicClock`; the simulator hands
them a :class:`SimClock`, which reads SimPy's ``env.now``. The heartbeat detector of
``failsoft.policies.detection`` therefore runs unchanged in both: only where ``now`` comes from
differs. Times are seconds, as everywhere in failsoft.
"""

from __future__ import annotations

import simpy


class SimClock:
    """A :class:`~failsoft.clock.Clock` whose ``now`` is the simulation's current time."""

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env

    def now(self) -> float:
        return float(self._env.now)
