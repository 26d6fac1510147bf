"""What a deploy becomes: the difference between what runs and a new config, as an ordered plan.

``failsoft deploy CONFIG`` changes a running cluster in place, as Ray Serve's ``serve deploy``
does. This module decides *what* changes and in which order, with no I/O (the orchestration core
carries the plan out, :mod:`~failsoft.orchestration.deploy_run`):

* :class:`Running` is what runs: the deployment (apps with their home placement, services, policy
  settings) and, per app, the placements it holds now (its route, an upgrade target) and the warm
  backups; :class:`Desired` is the new config, resolved to a deployment.
* :func:`plan_deploy` compares them and returns a :class:`DeployPlan`: apps **removed** (drained,
  then unloaded), apps **moved** (a new server or variant: loaded beside the old placement, warmed
  up, the route switched, the old unloaded after the drain period), apps **added** (loaded, then
  published), apps whose settings change in place (criticality, rate, SLO), the services added and
  removed (a changed service is both), and the policy settings. Steps are ordered removals first,
  then moves, then additions, each placed where the memory it needs is free by then; a step that
  could only fit after a later one is moved behind it.
* A config that cannot be applied is refused whole with one :class:`DeployRefused` line: other
  servers than the running ones, an app that changes family, an app or service whose mode changes,
  a step for which no order frees enough memory (warm backups that are not a mechanism's own count
  as free: the deploy releases them and they are re-planned afterwards).
* :func:`apply_plan` is the plan's effect on a deployment: ``apply_plan(a, plan_deploy(a, b))`` is
  ``b``, and ``plan_deploy(a, a)`` is empty (a deploy is idempotent); the core adopts
  ``apply_plan``'s result, so what the tests check of it is what the runtime does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, WarmBackup
from failsoft.errors import ConfigError
from failsoft.services import Service, ServiceMode

MEMORY_EPS_MB = 1e-9


class DeployRefused(ConfigError):
    """A config that cannot be applied to what runs; nothing was changed."""


class MemoryRefused(DeployRefused):
    """Refused because no order of the steps frees the memory one of them needs."""


class StepKind(StrEnum):
    REMOVE = "remove"  # drain, then unload every placement of the app
    MOVE = "move"  # load the new home beside the old, switch the route, drain and unload the old
    ADD = "add"  # load the home, then publish its route


@dataclass(frozen=True, slots=True)
class Step:
    """One app's change. ``old``: what it holds now (REMOVE, MOVE); ``new``: its new home (MOVE,
    ADD); ``spec``: the app as the new config states it (MOVE, ADD). A step waits for the earlier
    steps that touch one of its ``servers`` (the memory check assumed that order)."""

    kind: StepKind
    app: str
    old: tuple[Placement, ...] = ()
    new: Placement | None = None
    spec: App | None = None

    @property
    def servers(self) -> frozenset[str]:
        touched = {p.server for p in self.old}
        if self.new is not None:
            touched.add(self.new.server)
        return frozenset(touched)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "app": self.app,
            "old": [_where(p) for p in self.old],
            "new": None if self.new is None else _where(self.new),
        }


@dataclass(frozen=True)
class Running:
    """What runs: the deployment, each app's placements now (route, upgrade target), warm backups."""

    deployment: Scenario
    policy: str
    replan_delay_s: float
    placed: Mapping[str, tuple[Placement, ...]] = field(default_factory=dict)
    warm: tuple[WarmBackup, ...] = ()


@dataclass(frozen=True)
class Desired:
    """A new config, resolved: its deployment (every app placed), failover policy and its delay."""

    deployment: Scenario
    policy: str
    replan_delay_s: float


@dataclass(frozen=True)
class DeployPlan:
    """The ordered difference between a :class:`Running` and a :class:`Desired` deployment."""

    steps: tuple[Step, ...] = ()
    changed: tuple[App, ...] = ()  # settings changed in place (same home)
    services_added: tuple[Service, ...] = ()
    services_removed: tuple[str, ...] = ()
    families: tuple[Family, ...] = ()  # the new deployment's families
    policy: PolicyParams | None = None  # new policy parameters (None: unchanged)
    policy_name: str | None = None  # a new failover policy (None: unchanged)
    replan_delay_s: float | None = None  # a new warm re-plan delay (None: unchanged)
    order: tuple[str, ...] = ()  # every app of the new deployment, in its config's order

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.changed
            or self.services_added
            or self.services_removed
            or self.policy is not None
            or self.policy_name is not None
            or self.replan_delay_s is not None
        )

    def of(self, kind: StepKind) -> tuple[str, ...]:
        return tuple(s.app for s in self.steps if s.kind is kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "empty": self.empty,
            "added": list(self.of(StepKind.ADD)),
            "removed": list(self.of(StepKind.REMOVE)),
            "moved": list(self.of(StepKind.MOVE)),
            "changed": [a.name for a in self.changed],
            "services_added": [s.name for s in self.services_added],
            "services_removed": list(self.services_removed),
            "policy_changed": self.policy is not None or self.policy_name is not None,
            "steps": [s.to_dict() for s in self.steps],
        }


def plan_deploy(running: Running, desired: Desired) -> DeployPlan:
    """The plan that turns ``running`` into ``desired``; :class:`DeployRefused` when none can."""
    cur, new = running.deployment, desired.deployment
    _check_servers(cur, new)
    old_apps, new_apps = {a.name: a for a in cur.apps}, {a.name: a for a in new.apps}
    _check_modes(cur, new, old_apps, new_apps)
    steps: list[Step] = []
    changed: list[App] = []
    for name in old_apps:
        if name not in new_apps:
            steps.append(Step(StepKind.REMOVE, name, running.placed.get(name, ())))
    for name, app in new_apps.items():
        before = old_apps.get(name)
        assert app.primary is not None, f"app {name!r} of a desired deployment is not placed"
        if before is None:
            steps.append(Step(StepKind.ADD, name, (), app.primary, app))
        elif before.primary != app.primary:
            steps.append(Step(StepKind.MOVE, name, running.placed.get(name, ()), app.primary, app))
        elif before != app:
            changed.append(app)
    old_services = {s.name: s for s in cur.services}
    new_services = {s.name: s for s in new.services}
    added = tuple(s for n, s in new_services.items() if old_services.get(n) != s)
    removed = tuple(n for n, s in old_services.items() if new_services.get(n) != s)
    return DeployPlan(
        steps=_ordered(steps, running, new),
        changed=tuple(changed),
        services_added=added,
        services_removed=removed,
        families=new.families,
        policy=None if new.policy == cur.policy else new.policy,
        policy_name=None if desired.policy == running.policy else desired.policy,
        replan_delay_s=None if desired.replan_delay_s == running.replan_delay_s else desired.replan_delay_s,
        order=tuple(new_apps),
    )


def apply_plan(deployment: Scenario, plan: DeployPlan) -> Scenario:
    """The deployment ``plan`` makes of ``deployment`` (what the core adopts)."""
    apps = {a.name: a for a in deployment.apps}
    for step in plan.steps:
        if step.kind is StepKind.REMOVE:
            apps.pop(step.app, None)
        else:
            assert step.spec is not None
            apps[step.app] = step.spec
    for app in plan.changed:
        apps[app.name] = app
    gone = set(plan.services_removed)
    services = [s for s in deployment.services if s.name not in gone] + list(plan.services_added)
    rank = {name: i for i, name in enumerate(plan.order)}
    order = sorted(apps.values(), key=lambda a: rank.get(a.name, len(rank)))
    service_rank = {s.name: i for i, s in enumerate(services)}
    return deployment.replace(
        families=plan.families,
        apps=tuple(order),
        services=tuple(sorted(services, key=lambda s: service_rank[s.name])),
        policy=plan.policy if plan.policy is not None else deployment.policy,
        warm=None,
    )


# checks ---------------------------------------------------------------------------------------------
def _check_servers(cur: Scenario, new: Scenario) -> None:
    if cur.servers != new.servers:

        def show(s: Scenario) -> str:
            return ", ".join(f"{x.name}@{x.site} {x.memory_mb:g} MB" for x in s.servers)

        raise DeployRefused(
            f"the servers differ from the running cluster's ({show(new)} against {show(cur)}): "
            "servers change only with a restart of 'failsoft serve'"
        )


def _modes(deployment: Scenario) -> dict[str, tuple[ServiceMode, str]]:
    """Each app's mode and the service that serves it."""
    return {m: (s.mode, s.name) for s in deployment.all_services() for m in s.members}


def _check_modes(cur: Scenario, new: Scenario, old_apps: dict[str, App], new_apps: dict[str, App]) -> None:
    before, after = _modes(cur), _modes(new)
    for name, app in new_apps.items():
        old = old_apps.get(name)
        if old is None:
            continue
        if old.family != app.family:
            raise DeployRefused(
                f"app {name!r} changes family ({old.family} -> {app.family}): remove it and add the "
                "new model under another name"
            )
        (m0, s0), (m1, s1) = before[name], after[name]
        if m0 != m1:
            raise DeployRefused(
                f"app {name!r} changes mode ({m0.value} in service {s0!r} -> {m1.value} in service "
                f"{s1!r}): a service's members cannot change mode in place; deploy the new service "
                "under new app names"
            )
    old_services = {s.name: s for s in cur.services}
    for service in new.services:
        old = old_services.get(service.name)
        if old is not None and old.mode != service.mode:
            raise DeployRefused(
                f"service {service.name!r} changes mode ({old.mode.value} -> {service.mode.value}): "
                "remove it and deploy the new one under another name"
            )


# ordering under memory --------------------------------------------------------------------------------
class _Memory:
    """Memory per server as steps are carried out, with the unpinned warm backups that may be freed."""

    def __init__(self, running: Running, new: Scenario) -> None:
        self.cur, self.new = running.deployment, new
        self.capacity = {s.name: s.memory_mb for s in self.cur.servers}
        self.used = dict.fromkeys(self.capacity, 0.0)
        self.spare = dict.fromkeys(self.capacity, 0.0)  # unpinned warm backups: released when needed
        self.held: dict[str, list[tuple[Placement, float]]] = {}
        for name, places in running.placed.items():
            app = self.cur.app(name)
            for p in dict.fromkeys(places):
                mb = self.cur.variant_of(app, p.variant).memory_mb
                self.used[p.server] += mb
                self.held.setdefault(name, []).append((p, mb))
        for w in running.warm:
            mb = self.cur.variant_of(self.cur.app(w.app), w.variant).memory_mb
            self.used[w.server] += mb
            if not w.pinned:
                self.spare[w.server] += mb
            self.held.setdefault(w.app, []).append((Placement(w.server, w.variant), mb))

    def fits(self, step: Step) -> float | None:
        """None when ``step`` fits now, else the memory free on its new server."""
        if step.new is None or step.new in step.old:
            return None
        assert step.spec is not None
        need = self.new.variant_of(step.spec, step.new.variant).memory_mb
        s = step.new.server
        free = self.capacity[s] - self.used[s] + self.spare[s]
        return None if need <= free + MEMORY_EPS_MB else free

    def take(self, step: Step) -> None:
        if step.new is not None and step.new not in step.old:
            assert step.spec is not None
            s = step.new.server
            need = self.new.variant_of(step.spec, step.new.variant).memory_mb
            if self.used[s] + need > self.capacity[s] + MEMORY_EPS_MB:
                self.used[s] -= self.spare[s]  # the deploy releases those backups
                self.spare[s] = 0.0
            self.used[s] += need
        if step.kind is not StepKind.ADD:
            for p, mb in self.held.pop(step.app, []):
                if step.kind is StepKind.MOVE and p == step.new:
                    continue
                self.used[p.server] -= mb


def _ordered(steps: list[Step], running: Running, new: Scenario) -> tuple[Step, ...]:
    """Removals, then moves, then additions, each as soon as the memory it needs is free."""
    rank = {StepKind.REMOVE: 0, StepKind.MOVE: 1, StepKind.ADD: 2}
    pending = sorted(steps, key=lambda s: rank[s.kind])
    memory = _Memory(running, new)
    done: list[Step] = []
    while pending:
        for i, step in enumerate(pending):
            if memory.fits(step) is None:
                memory.take(step)
                done.append(pending.pop(i))
                break
        else:
            step = pending[0]
            assert step.new is not None and step.spec is not None
            need = new.variant_of(step.spec, step.new.variant).memory_mb
            free = memory.fits(step)
            raise MemoryRefused(
                f"memory: app {step.app!r} needs {need:g} MB for {step.new.variant!r} on server "
                f"{step.new.server!r} ({step.kind.value}), but at most {max(free or 0.0, 0.0):g} of "
                f"{memory.capacity[step.new.server]:g} MB would be free there during the deploy "
                "(its other apps stay loaded until their own moves are done)"
            )
    return tuple(done)


def _where(p: Placement) -> dict[str, str]:
    return {"server": p.server, "variant": p.variant}


def replace_app(deployment: Scenario, app: App) -> Scenario:
    """``deployment`` with ``app`` (by name) replaced: a rolled-back move restores its old home."""
    return deployment.replace(apps=tuple(app if a.name == app.name else a for a in deployment.apps))


__all__ = [
    "DeployPlan",
    "DeployRefused",
    "Desired",
    "MemoryRefused",
    "Running",
    "Step",
    "StepKind",
    "apply_plan",
    "plan_deploy",
    "replace_app",
]
