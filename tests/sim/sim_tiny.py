"""A tiny cluster whose failure and recovery can be computed by hand.

One family with two variants (``small``: 100 MB, 200 ms to load, accuracy 0.70; ``big``: 300 MB,
1000 ms, 0.80). Three apps run ``big`` on ``s0``; critical ``A`` has a warm ``small`` backup on
``s1``. With heartbeats every 20 ms at phase 0, health checks every 100 ms half-way between
heartbeats (0.01 + k * 0.1 s) and ``s0`` crashing at 0.31 s (last heartbeat 0.30 s), the controller
declares ``s0`` failed at the first check more than 40 ms after 0.30 s: 0.41 s.
"""

from __future__ import annotations

from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant, WarmBackup

SMALL = Variant("small", 100, 0.70, 200, 5)
BIG = Variant("big", 300, 0.80, 1000, 10)
FAILURE_AT = 0.31
DETECTED_AT = 0.41  # first check 0.01 + k * 0.1 with now - 0.30 > 2 * 0.02
NOTIFY_S = 0.010


def tiny_scenario(s1_mb: float = 400, s2_mb: float = 450, rate_rps: float = 1.0) -> Scenario:
    family = Family("fam", (SMALL, BIG))
    servers = (Server("s0", "a", 1000, 10.0), Server("s1", "b", s1_mb, 10.0), Server("s2", "b", s2_mb, 10.0))
    apps = tuple(
        App(name, "fam", Placement("s0", "big"), name == "A", rate_rps, 100.0) for name in ("A", "B", "C")
    )
    return Scenario(servers, (family,), apps, PolicyParams(), (WarmBackup("A", "small", "s1"),))
