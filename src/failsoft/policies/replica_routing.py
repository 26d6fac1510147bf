"""Which of an app's replicas takes a request: the power of two choices on ongoing requests.

Ray Serve's router (``PowerOfTwoChoicesRequestRouter``) samples two replicas at random and sends the
request to the one with fewer requests in flight. Sampling two rather than scanning all keeps the
choice cheap and, more usefully, keeps several routers (or requests decided at the same instant)
from herding onto the one replica that looked emptiest; yet it avoids a busy replica almost as well
as the full scan (Mitzenmacher's "power of two choices"). Pure: the counts and the random source are
the caller's, so the gateway and the simulator route identically.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence


def power_of_two(candidates: Sequence[str], ongoing: Mapping[str, int], rng: random.Random) -> str:
    """Of two of ``candidates`` drawn at random, the one with fewer ``ongoing`` requests (the first
    drawn on a tie); the only one when there is one. ``candidates`` must not be empty."""
    if not candidates:
        raise ValueError("power_of_two needs at least one candidate")
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(list(candidates), 2)
    return b if ongoing.get(b, 0) < ongoing.get(a, 0) else a
