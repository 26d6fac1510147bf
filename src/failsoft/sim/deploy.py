"""Deployments: a scenario, a failover policy looked up by name, and that policy's warm backups.

Before any failure the controller deploys the apps and asks the policy for warm backups
(``plan_proactive``, FailLite 3.2); the simulator does the same, once per scenario and policy, and
reuses the deployment for every failure event injected into it.

Policy labels are the runtime's policy names (``failsoft.policies.failover.policy_names()``) plus one
simulator-only label, ``faillite-paper``: the *same* ``faillite`` policy object run with
``PolicyParams.reclaim_warm=False``, i.e. FailLite's Algorithm 1 without failsoft's make-room pass
(see ``failsoft/policies/failover/progressive.py``). It exists to reproduce the paper's numbers
next to failsoft's; no policy logic lives here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import simpy

from failsoft.domain import ProactivePlan, Scenario
from failsoft.errors import ConfigError
from failsoft.policies.failover.interface import FailoverPolicy
from failsoft.policies.registry import failover_names as policy_names
from failsoft.policies.registry import get_failover_policy
from failsoft.sim.agent import SimAgent
from failsoft.sim.config import SimConfig
from failsoft.sim.trace import EventLog

# label -> (registered policy name, PolicyParams overrides)
_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "faillite-paper": ("faillite", {"reclaim_warm": False}),
}
DEFAULT_POLICIES = ("faillite", "faillite-paper", "full-warm", "full-cold", "full-warm-k")


def policy_labels() -> list[str]:
    return sorted({*policy_names(), *_VARIANTS})


def resolve(label: str) -> tuple[str, dict[str, Any]]:
    """The registered policy name and parameter overrides a label stands for."""
    if label in _VARIANTS:
        return _VARIANTS[label]
    if label in policy_names():
        return label, {}
    raise ConfigError(f"unknown policy {label!r} (known: {', '.join(policy_labels())})")


@dataclass(frozen=True)
class Deployment:
    """What a failure event starts from: the scenario with its warm backups, and the policy."""

    label: str
    policy: FailoverPolicy
    scenario: Scenario  # ``warm`` is set
    proactive: ProactivePlan | None  # None when the scenario came with its warm backups

    def steady_holdings(self) -> dict[str, tuple[dict[tuple[str, str], int], float]]:
        """Per server: the (app, variant) copies its primaries and warm backups hold before a
        failure, and their MB (summed in the order loads add them); worked out once, since a sweep
        starts thousands of events from one deployment. ConfigError when a server cannot hold them."""
        cached = self.__dict__.get("_steady_holdings")
        if cached is None:
            cached = self.__dict__["_steady_holdings"] = _holdings(self.scenario)  # derived, not a field
        return cached


def _holdings(scenario: Scenario) -> dict[str, tuple[dict[tuple[str, str], int], float]]:
    """The agents' own memory accounting, on a scratch clock."""
    env, config, log = simpy.Environment(), SimConfig(), EventLog(False)
    agents = {s.name: SimAgent(env, s, config, log) for s in scenario.servers}
    for app in scenario.apps:
        if app.primary is not None:
            agents[app.primary.server].preload(app.name, scenario.primary_variant(app))
    for backup in scenario.warm or ():
        app = scenario.app(backup.app)
        agents[backup.server].preload(app.name, scenario.variant_of(app, backup.variant))
    return {name: (dict(a.models), a.used_mb) for name, a in agents.items() if a.models}


class Deployer:
    """Deploys scenarios under policy labels, solving each distinct proactive problem once.

    ``faillite`` and ``faillite-paper`` differ only in ``reclaim_warm``, which ``plan_proactive``
    does not read (it is a failover-time choice), so they share one warm-backup plan.
    """

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], ProactivePlan] = {}

    def deploy(self, scenario: Scenario, label: str) -> Deployment:
        name, overrides = resolve(label)
        policy = get_failover_policy(name)
        scenario = scenario.replace(policy=dataclasses.replace(scenario.policy, **overrides))
        if scenario.warm is not None:
            return Deployment(label, policy, scenario, None)
        params = dataclasses.replace(scenario.policy, reclaim_warm=True)
        key = (scenario.servers, scenario.families, scenario.apps, name, params)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = policy.plan_proactive(scenario)
        return Deployment(label, policy, scenario.replace(warm=plan.warm), plan)
