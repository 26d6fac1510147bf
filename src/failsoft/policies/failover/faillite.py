"""FailLite: heterogeneous warm backups by ILP, then progressive cold failover (sections 3.1-3.4)."""

from __future__ import annotations

import time
from collections.abc import Collection

from failsoft.domain import FailoverPlan, ProactivePlan, Scenario
from failsoft.policies.failover.common import affected_apps, initial_ledger, warm_switches
from failsoft.policies.failover.interface import FailoverPolicy, check_failed, elapsed_ms
from failsoft.policies.failover.proactive import plan_warm_ilp
from failsoft.policies.failover.progressive import place_progressive


class FailLitePolicy(FailoverPolicy):
    """Warm backups of any variant for the critical apps (3.2); Algorithm 1 for the rest (3.3)."""

    name = "faillite"

    def plan_proactive(self, scenario: Scenario, unavailable: Collection[str] = ()) -> ProactivePlan:
        return plan_warm_ilp(scenario, self.name, unavailable)

    def plan_failover(self, scenario: Scenario, failed: Collection[str]) -> FailoverPlan:
        started = time.perf_counter()
        failed = check_failed(scenario, failed)
        scenario = self.with_warm(scenario)
        ledger = initial_ledger(scenario, failed)
        warm, rest = warm_switches(scenario, affected_apps(scenario, failed), failed, ledger)
        reclaimable = []
        if scenario.policy.reclaim_warm:
            in_use = {(a.app, a.server) for a in warm}
            reclaimable = [
                b for b in scenario.warm or () if b.server not in failed and (b.app, b.server) not in in_use
            ]
        result = place_progressive(scenario, rest, ledger, reclaimable)
        return FailoverPlan(
            self.name,
            failed,
            tuple(warm + result.actions),
            tuple(result.unrecovered),
            elapsed_ms(started),
            tuple(result.released),
        )
