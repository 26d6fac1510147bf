"""Greedy warm-backup placement: the full-size baselines' whole strategy and the ILP's start point."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from failsoft.domain import App, Demand, Scenario, Variant, WarmBackup
from failsoft.policies.failover.common import warm_exclusions
from failsoft.policies.failover.ledger import Ledger


def place_warm_greedy(
    scenario: Scenario,
    apps: Sequence[App],
    preferences: Callable[[App], Sequence[Variant]],
    ledger: Ledger,
    budget: Demand | None,
    replicas: int,
) -> tuple[list[WarmBackup], list[str]]:
    """Place ``replicas`` warm backups per app worst-fit, trying ``preferences(app)`` in order.

    Takes what it places from ``ledger`` and ``budget`` (``None``: no cluster-wide budget).
    Returns the backups and the apps left with fewer than ``replicas``.
    """
    backups: list[WarmBackup] = []
    short: list[str] = []
    remaining = budget
    for app in apps:
        excluded = warm_exclusions(scenario, app)
        got = 0
        for _ in range(replicas):
            for variant in preferences(app):
                demand = variant.demand(app.rate_rps)
                if remaining is not None and not demand.fits_in(remaining):
                    continue
                server = ledger.worst_fit(demand, exclude=excluded)
                if server is None:
                    continue
                ledger.take(server, demand)
                if remaining is not None:
                    remaining = remaining - demand
                excluded.add(server)
                backups.append(WarmBackup(app.name, variant.name, server))
                got += 1
                break
        if got < replicas:
            short.append(app.name)
    return backups, short
