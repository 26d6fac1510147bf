"""Autoscaling an app's replicas on its ongoing requests: Ray Serve's rule, as a pure policy.

Ray Serve's default autoscaler keeps each replica at ``target_ongoing_requests`` requests in flight
(queued or running): with ``total`` requests ongoing across the app, it wants
``ceil(total / target_ongoing_requests)`` replicas, clamped to ``[min_replicas, max_replicas]``. It
does not act on one reading: the ongoing count is averaged over the last ``look_back_s``, and a
wish to scale up (down) is carried out only once it has held for ``upscale_delay_s``
(``downscale_delay_s``) without interruption, so a burst does not add replicas that sit idle a
second later, and a lull does not take away capacity the next burst needs.

:class:`Autoscaler` is that rule for one app, with no I/O and no clock of its own: the orchestration
core feeds it readings (:meth:`Autoscaler.observe`) and asks it for a count
(:meth:`Autoscaler.decide`) at the times its driver gives, so the runtime's controller and the
simulator scale identically.
"""

from __future__ import annotations

import math
from collections import deque

from failsoft.domain import Autoscaling


def desired_replicas(config: Autoscaling, ongoing: float) -> int:
    """Ray Serve's formula: the replicas that keep ``ongoing`` requests at the target per replica."""
    want = math.ceil(ongoing / config.target_ongoing_requests - 1e-9) if ongoing > 0 else 0
    return max(config.min_replicas, min(config.max_replicas, want))


class Autoscaler:
    """One app's autoscaling decisions (see the module docstring)."""

    def __init__(self, config: Autoscaling) -> None:
        self.config = config
        self._readings: deque[tuple[float, float]] = deque()  # (at, ongoing)
        self._wish: int | None = None  # the count wished for since _wish_since
        self._wish_since = 0.0

    def observe(self, now: float, ongoing: float) -> None:
        """The app had ``ongoing`` requests in flight at ``now`` (readings older than the look-back
        window are forgotten)."""
        self._readings.append((now, max(ongoing, 0.0)))
        while self._readings and self._readings[0][0] < now - self.config.look_back_s:
            self._readings.popleft()

    def average(self) -> float:
        """The ongoing requests averaged over the look-back window (0 with no reading)."""
        if not self._readings:
            return 0.0
        return sum(o for _, o in self._readings) / len(self._readings)

    def decide(self, now: float, current: int) -> int:
        """The replica count to have at ``now``, given ``current``: ``current`` until a different
        wish has held for its delay, then the wish."""
        wish = desired_replicas(self.config, self.average())
        if wish == current:
            self._wish = None
            return current
        if self._wish is None or (wish > current) != (self._wish > current):
            self._wish, self._wish_since = wish, now  # a new direction: its delay starts now
        else:
            self._wish = wish  # the same direction: the latest size, the delay already running
        delay = self.config.upscale_delay_s if wish > current else self.config.downscale_delay_s
        if now - self._wish_since >= delay - 1e-9:
            self._wish = None
            return wish
        return current
