"""How long a coding group waits for its k-th query: the fill timeout policy.

ParM (section 4.1) and its public code wait for a group's k-th query without bound: at the paper's
loads groups fill at once. failsoft bounds the wait (so a lone query's group is released, uncoded,
and nothing is held for ever), and the bound must not cost the protection the paper has. A group
opened at time t fills when k - 1 more queries arrive; with Poisson arrivals at rate lambda that
wait is Erlang(k - 1, lambda) distributed, so waiting

    T = x_q(k - 1) / lambda,   x_q(m): the q-quantile of Erlang(m, 1)

fills a fraction q of the groups, at every rate and k. A fixed timeout instead leaves more groups
uncoded the lower the rate and the larger k (at 10 ms: 30 % of groups at 120 qps with k = 2, 49 % at
270 qps with k = 4 in the simulator). :class:`FillTimeout` is that rule: ``"rate"`` (the default of
a coded service) estimates lambda from the last ``window`` arrivals and gives ``min(cap, max(1 ms, T))``
with q = :data:`FILL_QUANTILE`; ``"fixed"`` gives ``cap`` always. Until ``MIN_ARRIVALS`` arrivals are
seen it gives ``cap``. The cap is the coded service's ``fill_timeout_ms``: the longest a group may
wait (a parity query sent later than that protects little).

Time is passed in; pure and numpy-free. :class:`~failsoft.policies.coding.groups.GroupFormer` uses it,
so the gateway's dispatcher and the simulator share it.
"""

from __future__ import annotations

import math
from collections import deque
from functools import lru_cache

from failsoft.errors import ConfigError

FILL_POLICIES = ("rate", "fixed")
FILL_QUANTILE = 0.99  # groups that fill before their timeout, at a steady Poisson rate
RATE_WINDOW = 64  # arrivals the rate is estimated from
MIN_ARRIVALS = 8  # fewer: no estimate, the cap applies
MIN_TIMEOUT_S = 0.001  # a floor, so that queries arriving together (a burst) are coded together


@lru_cache(maxsize=32)
def erlang_quantile(shape: int, q: float) -> float:
    """The q-quantile of the Erlang(``shape``, rate 1) distribution (the time to ``shape`` arrivals)."""
    if not (isinstance(shape, int) and shape >= 1):
        raise ConfigError(f"erlang shape must be an integer >= 1; got {shape!r}")
    if not 0 < q < 1:
        raise ConfigError(f"quantile must be in (0, 1); got {q!r}")

    def cdf(x: float) -> float:
        term, tail = 1.0, 1.0  # sum_{n < shape} x^n / n!
        for n in range(1, shape):
            term *= x / n
            tail += term
        return 1.0 - math.exp(-x) * tail

    low, high = 0.0, 1.0
    while cdf(high) < q:
        high *= 2.0
    for _ in range(100):
        mid = (low + high) / 2.0
        low, high = (mid, high) if cdf(mid) < q else (low, mid)
    return (low + high) / 2.0


class FillTimeout:
    """A group's fill timeout: ``"rate"`` (Erlang quantile at the arrival rate, capped) or ``"fixed"``."""

    def __init__(
        self,
        k: int,
        cap_ms: float,
        policy: str = "rate",
        quantile: float = FILL_QUANTILE,
        window: int = RATE_WINDOW,
    ) -> None:
        if policy not in FILL_POLICIES:
            raise ConfigError(f"fill policy must be one of {', '.join(FILL_POLICIES)}; got {policy!r}")
        if not (isinstance(cap_ms, (int, float)) and 0 < cap_ms <= 10_000):
            raise ConfigError(f"fill_timeout_ms must be in (0, 10000]; got {cap_ms!r}")
        if not (isinstance(window, int) and window >= MIN_ARRIVALS):
            raise ConfigError(f"fill rate window must be an integer >= {MIN_ARRIVALS}; got {window!r}")
        self.k, self.policy = k, policy
        self.cap_s = float(cap_ms) / 1000.0
        self.quantile = quantile
        self.scale = erlang_quantile(k - 1, quantile) if k > 1 else 0.0  # T * lambda
        self._arrivals: deque[float] = deque(maxlen=window)

    def arrived(self, now_s: float) -> None:
        """A query arrived at ``now_s`` (non-decreasing)."""
        if self.policy == "rate":
            self._arrivals.append(now_s)

    def rate_per_s(self) -> float | None:
        """The arrival rate over the window, or ``None`` before ``MIN_ARRIVALS`` arrivals."""
        arrivals = self._arrivals
        if len(arrivals) < MIN_ARRIVALS:
            return None
        span = arrivals[-1] - arrivals[0]
        return (len(arrivals) - 1) / span if span > 0 else math.inf

    def timeout_s(self) -> float:
        """How long a group opened now may wait for its k-th query."""
        if self.policy == "fixed":
            return self.cap_s
        rate = self.rate_per_s()
        if rate is None:
            return self.cap_s
        return min(self.cap_s, max(MIN_TIMEOUT_S, self.scale / rate))
