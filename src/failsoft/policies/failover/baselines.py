"""The full-size baselines of FailLite 5.1: backups are always the primary's own variant.

* ``full-warm``: full-size warm backups for the critical apps first, then for all the others, in all
  the free capacity; an app without one is not recovered.
* ``full-cold``: no warm backups; on failure, full-size cold backups are loaded, the critical apps
  first, then the others in random order (seeded by ``policy.seed``).
* ``full-warm-k``: full-size warm backups for the critical apps only, within the same ``(1 - alpha)``
  budget FailLite's ILP has, and full-size cold backups for everyone else.

Placement is worst-fit by free memory throughout, as in FailLite.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection

from failsoft.domain import ActionKind, App, FailoverAction, ProactivePlan, Scenario
from failsoft.policies.failover.common import Failure, Recovery
from failsoft.policies.failover.interface import FailoverPolicy, elapsed_ms
from failsoft.policies.failover.ledger import Ledger
from failsoft.policies.failover.warm_greedy import place_warm_greedy


def _full_size(scenario: Scenario, app: App) -> tuple:
    return (scenario.primary_variant(app),)


class _FullSize(FailoverPolicy):
    warm_critical = False
    warm_others = False
    budgeted = False

    def plan_proactive(self, scenario: Scenario, unavailable: Collection[str] = ()) -> ProactivePlan:
        started = time.perf_counter()
        placed = [a for a in scenario.apps if a.primary is not None and a.primary.server not in unavailable]
        wanted = [a for a in placed if a.critical] if self.warm_critical else []
        if self.warm_others:
            wanted += [a for a in placed if not a.critical]
        ledger = Ledger(scenario.free(unavailable, include_warm=False))
        budget = ledger.total().scaled(1 - scenario.policy.alpha) if self.budgeted else None
        warm, short = place_warm_greedy(
            scenario, wanted, lambda a: _full_size(scenario, a), ledger, budget, scenario.policy.warm_replicas
        )
        value = sum(scenario.app(w.app).rate_rps for w in warm)  # full size: normalised accuracy is 1
        return ProactivePlan(self.name, tuple(warm), tuple(short), value, elapsed_ms(started), 0.0, True)

    def recover(self, failure: Failure) -> Recovery:
        if self.warm_others:  # full-warm has no cold backups
            return Recovery(unrecovered=[a.name for a in failure.rest])
        scenario, ledger = failure.scenario, failure.ledger
        rng = random.Random(scenario.policy.seed)
        critical = [a for a in failure.rest if a.critical]
        others = [a for a in failure.rest if not a.critical]
        rng.shuffle(critical)
        rng.shuffle(others)
        recovery = Recovery()
        for app in critical + others:
            variant = scenario.primary_variant(app)
            demand = variant.demand(app.rate_rps)
            server = ledger.worst_fit(demand)
            if server is None:
                recovery.unrecovered.append(app.name)
                continue
            ledger.take(server, demand)
            recovery.actions.append(
                FailoverAction(app.name, ActionKind.COLD, server, variant.name, variant.name)
            )
        return recovery


class FullWarmPolicy(_FullSize):
    name = "full-warm"
    warm_critical = True
    warm_others = True


class FullColdPolicy(_FullSize):
    name = "full-cold"


class FullWarmKPolicy(_FullSize):
    name = "full-warm-k"
    warm_critical = True
    budgeted = True
