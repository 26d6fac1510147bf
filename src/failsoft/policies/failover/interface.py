"""The failover-policy seam: what the controller, the simulator and the CLI call, and when.

A policy is two pure functions of a cluster snapshot (:class:`~failsoft.domain.Scenario`):

* :meth:`FailoverPolicy.plan_proactive` is called when apps are deployed or the cluster changes
  (a server joins, comes back, or a failover completes): it decides the warm backups;
* :meth:`FailoverPolicy.plan_failover` is called when servers are detected as failed: it decides,
  for every app whose primary was on them, where and on which variant it is served next.

Neither touches the network, a clock or a process: the runtime and the simulator apply the plan and
report what happened. Policies are looked up by name in :mod:`failsoft.policies.registry`; this
contract module imports no implementation.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import ClassVar

from failsoft.domain import FailoverPlan, ProactivePlan, Scenario
from failsoft.errors import UnknownNameError
from failsoft.policies.failover.common import (
    Failure,
    Recovery,
    affected_apps,
    initial_ledger,
    warm_switches,
)


class FailoverPolicy(ABC):
    """Base of the failover policies; ``name`` is the one the registry lists it under."""

    name: ClassVar[str]

    @abstractmethod
    def plan_proactive(self, scenario: Scenario, unavailable: Collection[str] = ()) -> ProactivePlan:
        """Warm backups for the scenario (its ``warm`` field is ignored).

        ``unavailable`` servers (failed, or being drained) hold no backup, and apps served there are
        skipped: the runtime re-plans after a failover while the failed server is still down.
        """

    def plan_failover(self, scenario: Scenario, failed: Collection[str]) -> FailoverPlan:
        """Recovery of the apps whose primary is on ``failed``, given the scenario's warm backups.

        Every policy first switches affected apps to live warm backups; :meth:`recover` decides the rest.
        """
        started = time.perf_counter()
        failed = check_failed(scenario, failed)
        scenario = self.with_warm(scenario)
        ledger = initial_ledger(scenario, failed)
        warm, rest = warm_switches(scenario, affected_apps(scenario, failed), failed, ledger)
        recovery = self.recover(Failure(scenario, failed, ledger, warm, rest))
        return FailoverPlan(
            self.name,
            failed,
            tuple(warm + recovery.actions),
            tuple(recovery.unrecovered),
            elapsed_ms(started),
            tuple(recovery.released),
        )

    @abstractmethod
    def recover(self, failure: Failure) -> Recovery:
        """Recovery of the affected apps without a live warm backup, on the ledger's servers."""

    def with_warm(self, scenario: Scenario) -> Scenario:
        """The scenario with warm backups: its own when known, else this policy's proactive plan."""
        if scenario.warm is not None:
            return scenario
        return scenario.replace(warm=self.plan_proactive(scenario).warm)


def check_failed(scenario: Scenario, failed: Collection[str]) -> tuple[str, ...]:
    """Validate failed server names; an unknown one is an error that names it."""
    unknown = [s for s in failed if not scenario.has_server(s)]
    if unknown:
        raise UnknownNameError(f"failed server {unknown[0]!r} is not in the scenario")
    return tuple(dict.fromkeys(failed))


def elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
