"""FailLite: heterogeneous warm backups by ILP, then progressive cold failover (sections 3.1-3.4)."""

from __future__ import annotations

from collections.abc import Collection

from failsoft.domain import ProactivePlan, Scenario
from failsoft.policies.failover.common import Failure, Recovery
from failsoft.policies.failover.interface import FailoverPolicy
from failsoft.policies.failover.proactive import plan_warm_ilp
from failsoft.policies.failover.progressive import place_progressive


class FailLitePolicy(FailoverPolicy):
    """Warm backups of any variant for the critical apps (3.2); Algorithm 1 for the rest (3.3)."""

    name = "faillite"

    def plan_proactive(self, scenario: Scenario, unavailable: Collection[str] = ()) -> ProactivePlan:
        return plan_warm_ilp(scenario, self.name, unavailable)

    def recover(self, failure: Failure) -> Recovery:
        reclaimable = []
        if failure.scenario.policy.reclaim_warm:  # warm backups of healthy apps on live servers
            in_use = {(a.app, a.server) for a in failure.warm}
            reclaimable = [
                b
                for b in failure.scenario.warm or ()
                if b.server not in failure.failed and (b.app, b.server) not in in_use and not b.pinned
            ]  # a pinned backup belongs to a mechanism (HAMS state, Jellyfish): never taken
        return place_progressive(failure.scenario, failure.rest, failure.ledger, reclaimable)
