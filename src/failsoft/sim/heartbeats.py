"""Every agent's heartbeats, worked out when the detector is about to judge them (FailLite 4).

Each agent pushes a heartbeat at ``phase + k * interval`` while it is alive and the controller
listens. Simulated one by one, those pushes were a third of a sweep's time (a hundred servers at
20 ms, four SimPy events per server per check of the detector) while nothing reads them between two
checks: a live server's heartbeat only moves the detector's "last heard" forward. So the feed keeps,
per agent, where its heartbeat clock stands, and before each health check (:meth:`HeartbeatFeed.catch_up`)
hands the detector each agent's latest heartbeat up to that moment, in one call per agent that has
spoken since the last check.

The times are the ones SimPy gave the per-heartbeat processes, to the last bit: a process resumed
at ``cur`` and waiting for ``due`` woke at ``cur + (due - cur)``, which is not always ``due`` in
floating point; the feed computes the same sum. Ties are ordered as SimPy ordered them: a heartbeat
due at the instant of a check was sent before it (its timeout was created a whole interval earlier),
and one due at the instant of a crash was not, unless it was scheduled while the processes started
(before the failure injection was).

What the feed leaves out: heartbeats nobody judged. Once the controller stops listening (every
failure detected) no check reads them; :meth:`HeartbeatFeed.tail_s` says when the last of the
per-heartbeat processes would have woken to see that, so the event ends at the same simulated time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class _Clock:
    """One agent's heartbeat clock: the next heartbeat's time and the time its wait began."""

    __slots__ = ("cur", "k", "next_t", "phase", "stop_at")

    def __init__(self, phase: float, interval: float) -> None:
        self.phase, self.k, self.cur = phase, 0, 0.0
        self.stop_at = float("inf")  # crash time: no heartbeat from then on
        self.next_t = self._time(interval)

    def _time(self, interval: float) -> float:
        due = self.phase + self.k * interval
        return self.cur + (due - self.cur) if due > self.cur else self.cur

    def sent(self, t: float) -> bool:
        """Whether the heartbeat due at ``t`` was sent (not after a crash; at it only if scheduled
        while the processes started, i.e. before the injection's own timeout)."""
        return t < self.stop_at or (t == self.stop_at and self.cur == 0.0)

    def advance(self, interval: float) -> None:
        self.cur, self.k = self.next_t, self.k + 1
        self.next_t = self._time(interval)


class HeartbeatFeed:
    """The heartbeats of ``phases`` (agent name -> phase, seconds) every ``interval_s``."""

    def __init__(self, phases: Iterable[tuple[str, float]], interval_s: float) -> None:
        self.interval_s = interval_s
        self._clocks = {name: _Clock(phase, interval_s) for name, phase in phases}
        self._due = [(c.next_t, i, name) for i, (name, c) in enumerate(self._clocks.items())]
        heapq.heapify(self._due)

    def crashed(self, server: str, at: float) -> None:
        """``server`` crashed at ``at``: it sends nothing from then on."""
        self._clocks[server].stop_at = at

    def catch_up(self, now: float, push: Callable[[str, float], object]) -> None:
        """Push each agent's latest heartbeat sent by ``now`` (ties included), once per agent."""
        due, interval, clocks = self._due, self.interval_s, self._clocks
        while due and due[0][0] <= now:
            _, order, name = heapq.heappop(due)
            clock = clocks[name]
            last = None
            stop_at, next_t, cur, k = clock.stop_at, clock.next_t, clock.cur, clock.k
            # clock.advance() inlined (the same arithmetic): this loop runs for every heartbeat
            while next_t <= now and (next_t < stop_at or (next_t == stop_at and cur == 0.0)):
                last = cur = next_t
                k += 1
                at = clock.phase + k * interval
                next_t = cur + (at - cur) if at > cur else cur
            clock.next_t, clock.cur, clock.k = next_t, cur, k
            if last is not None:
                push(name, last)
            if clock.sent(clock.next_t):  # a crashed agent leaves the heap
                heapq.heappush(due, (clock.next_t, order, name))

    def tail_s(self, now: float) -> float:
        """When the last live agent's heartbeat process would have woken after ``now`` (and ended,
        seeing nobody listen); ``now`` when none would have."""
        last = now
        for clock in self._clocks.values():
            while clock.next_t <= now and clock.sent(clock.next_t):  # sent, never caught up
                clock.advance(self.interval_s)
            last = max(last, clock.next_t)  # its process woke then, and ended
        return last
