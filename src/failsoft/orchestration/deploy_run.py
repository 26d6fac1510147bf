"""Carrying a deploy's plan out (:mod:`~failsoft.orchestration.deploy`): the core's collaborator.

The plan's steps run in its order, except that a step only waits for the earlier steps that touch
one of its servers (the memory check assumed exactly that order per server), so changes on
different servers go on together:

* **remove**: the app's operations are cancelled and its warm backups dropped; it keeps its route
  for ``retire_s`` (the gateway has stopped taking its requests; those on their way are answered),
  then every model of it is unloaded and it is forgotten (event ``deploy``, ``action: removed``);
* **move**: room is made on the new server if needed (warm backups that are not a mechanism's own
  are released; they are re-planned once the deploy is done), the new home is loaded beside the
  old placement at background priority (the agent warms it up), the route switched, the old
  placement unloaded after the drain period (event ``rollout``). If the load fails or the new
  server fails meanwhile, the app goes back to its old home and keeps its route: event
  ``rollback``, and no request saw anything;
* **add**: the app is loaded on its home and its route published (event ``deploy``,
  ``action: added``); a failed load is retried like any unserved app's.

The deploy's ``deploy`` events open (``phase: started``, with the plan) and close it
(``phase: done``, with the apps rolled back or not served).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from failsoft.domain import App, BackupState, Placement
from failsoft.orchestration.deploy import DeployPlan, Step, StepKind, replace_app
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.operations import Op, Operations
from failsoft.orchestration.state import RouteKind

DEPLOY_PRIORITY = Priority.WARM  # deploy loads yield the CPU to inference (background niceness)


@dataclass(eq=False)
class DeployRun:
    """A deploy under way: its steps waiting, those running (app -> its operation, or None while a
    removal drains or a finished move's old placement drains), and how they ended."""

    version: int
    plan: DeployPlan
    before: dict[str, App]  # the apps the plan moves, as they were (a rollback restores them)
    started_at: float
    waiting: list[Step] = field(default_factory=list)
    running: dict[str, tuple[Step, Op | None]] = field(default_factory=dict)
    rolled_back: dict[str, str] = field(default_factory=dict)  # app -> why
    unserved: list[str] = field(default_factory=list)  # added apps whose load failed (retried)
    finished_at: float | None = None

    def to_dict(self, wall: float) -> dict[str, Any]:
        return {
            "version": self.version,
            "state": "running" if self.finished_at is None else "done",
            "plan": self.plan.to_dict(),
            "waiting": [s.app for s in self.waiting],
            "running": sorted(self.running),
            "rolled_back": dict(self.rolled_back),
            "unserved": list(self.unserved),
            "started_at": self.started_at + wall,
            "finished_at": None if self.finished_at is None else self.finished_at + wall,
        }


class Deploys:
    """The deploys of the :class:`~failsoft.orchestration.core.Orchestrator` (one at a time).

    It owns the config ``version`` served (1 for the config the cluster started with) and ``run``,
    the last deploy (under way or done). The core adopts a plan's deployment and calls
    :meth:`start`; it hands over the returns home this started (:meth:`home_ended`) and its timers
    (:meth:`timer`), and asks :meth:`holds` before reconciling an app.
    """

    def __init__(self, effects: Effects, operations: Operations, drain_s: float, retire_s: float) -> None:
        self.fx, self.state, self.operations = effects, effects.state, operations
        self.drain_s, self.retire_s = drain_s, retire_s
        self.version = 1
        self.digest: str | None = None
        self.run: DeployRun | None = None

    @property
    def busy(self) -> bool:
        return self.run is not None and self.run.finished_at is None

    def holds(self, app: str) -> bool:
        """Whether a deploy under way will act on ``app`` (reconciliation leaves it alone)."""
        run = self.run
        if run is None or run.finished_at is not None:
            return False
        return app in run.running or any(s.app == app for s in run.waiting)

    def start(self, plan: DeployPlan, before: dict[str, App], digest: str | None, now: float) -> int:
        """Carry ``plan`` out (the core adopted its deployment); the new config version."""
        self.version += 1
        self.digest = digest
        self.run = DeployRun(self.version, plan, before, now, waiting=list(plan.steps))
        self.fx.emit("deploy", None, None, phase="started", version=self.version, **_summary(plan))
        self.progress(now)
        return self.version

    # the steps ----------------------------------------------------------------------------------
    def progress(self, now: float) -> None:
        """Start every waiting step no earlier unfinished step shares a server with; finish the run
        when nothing is left."""
        run = self.run
        if run is None or run.finished_at is not None:
            return
        blocked: set[str] = set()
        for step, _ in run.running.values():
            blocked |= step.servers
        for step in list(run.waiting):
            if step.servers & blocked:
                blocked |= step.servers
                continue
            run.waiting.remove(step)
            blocked |= step.servers
            self._begin(step, now)
        if not run.waiting and not run.running:
            run.finished_at = now
            self.fx.emit(
                "deploy",
                None,
                None,
                phase="done",
                version=run.version,
                rolled_back=dict(run.rolled_back),
                unserved=list(run.unserved),
                duration_ms=round((now - run.started_at) * 1000.0, 3),
            )

    def _begin(self, step: Step, now: float) -> None:
        run = self.run
        assert run is not None
        if step.kind is StepKind.REMOVE:
            self.operations.cancel(step.app, now)
            self.operations.backoff.pop(step.app, None)
            for key in [k for k in self.state.warm if k[0] == step.app]:
                self.state.warm.pop(key)
            run.running[step.app] = (step, None)
            self.fx.wake_at(now + self.retire_s, ("deploy-retire", step.app))
            return
        assert step.new is not None
        rec = self.state.apps[step.app]
        if rec.route == step.new:  # served there already (a failover put it there): nothing to load
            self.fx.set_route(rec, step.new, RouteKind.PRIMARY, None, now)
            self._served(step, None, now)
            return
        self._make_room(step.app, step.new)
        op = self.operations.return_home(step.app, now, event=None, priority=DEPLOY_PRIORITY)
        run.running[step.app] = (step, op)

    def _make_room(self, app: str, where: Placement) -> None:
        """Release warm backups (not pinned ones) on ``where.server`` until ``app``'s variant fits."""
        server = self.state.servers[where.server]
        need = self.state.variant(app, where.variant).memory_mb
        loading = sum(
            self.state.variant(j.app, j.variant).memory_mb
            for j in self.fx.jobs.values()
            if j.server == where.server and j.app in self.state.apps
        )
        free = server.server.memory_mb - self.state.used_mb(where.server) - loading
        spare = sorted(
            (w for (a, s), w in self.state.warm.items() if s == where.server and not w.backup.pinned),
            key=lambda w: -self.state.variant(w.backup.app, w.backup.variant).memory_mb,
        )
        for w in spare:
            if free >= need:
                return
            b = w.backup
            del self.state.warm[(b.app, b.server)]
            if w.state is BackupState.WARM and not self.fx.needed(b.app, b.server, b.variant):
                self.fx.unload(b.server, b.app, b.variant)
            free += self.state.variant(b.app, b.variant).memory_mb

    def home_ended(self, op: Op, ok: bool, now: float) -> None:
        """A return home ended: the step that started it (if any) is served, or rolled back."""
        run = self.run
        if run is None or run.finished_at is not None:
            return
        entry = run.running.get(op.app)
        if entry is None or entry[1] is not op:
            return
        step = entry[0]
        if ok:
            self._served(step, op, now)
        elif step.kind is StepKind.MOVE:
            self._roll_back(step, now)
        else:
            run.unserved.append(step.app)
            del run.running[step.app]
        self.progress(now)

    def _served(self, step: Step, op: Op | None, now: float) -> None:
        run = self.run
        assert run is not None and step.new is not None
        if step.kind is StepKind.ADD:
            self.fx.emit("deploy", step.app, step.new, action="added", version=run.version)
            run.running.pop(step.app, None)
            return
        previous = [{"server": p.server, "variant": p.variant} for p in step.old]
        self.fx.emit("rollout", step.app, step.new, previous=previous, version=run.version)
        run.running[step.app] = (step, None)  # its servers stay taken until the old placement drained
        self.fx.wake_at(now + self.drain_s, ("deploy-step", step.app))

    def _roll_back(self, step: Step, now: float) -> None:
        run = self.run
        assert run is not None
        old = run.before[step.app]
        rec = self.state.apps[step.app]
        rec.app = old
        self.state.deployment = replace_app(self.state.deployment, old)
        self.operations.backoff.pop(step.app, None)
        where = rec.route
        reason = "its new placement did not load, or its server failed"
        run.rolled_back[step.app] = reason
        del run.running[step.app]
        self.fx.emit("rollback", step.app, where, reason=reason, version=run.version)
        self.fx.attention.add(step.app)

    def timer(self, kind: str, app: str, now: float) -> None:
        """A deploy's timer: a removed app's drain is over, or a moved app's old placement drained."""
        run = self.run
        if run is None or app not in run.running:
            return
        if kind == "deploy-retire":
            self._retire(app)
            self.fx.emit("deploy", app, None, action="removed", version=run.version)
        del run.running[app]
        self.progress(now)

    def _retire(self, app: str) -> None:
        rec = self.state.apps.get(app)
        if rec is None:
            return
        held: set[tuple[str, str]] = set()
        for p in (rec.route, rec.final):
            if p is not None:
                held.add((p.server, p.variant))
        for server, srec in self.state.servers.items():
            held |= {(server, v) for a, v in srec.holdings if a == app}
        self.state.retire(app)
        self.fx.unrouted.discard(app)
        self.fx.unrecovered.discard(app)
        self.fx.changes += 1
        self.fx.publish(force=True)  # the table without it
        for server, variant in sorted(held):
            if self.state.live(server):
                self.fx.unload(server, app, variant)

    def to_dict(self, wall: float) -> dict[str, Any]:
        return {
            "version": self.version,
            "digest": self.digest,
            "last": None if self.run is None else self.run.to_dict(wall),
        }


def _summary(plan: DeployPlan) -> dict[str, Any]:
    d = plan.to_dict()
    return {k: d[k] for k in ("added", "removed", "moved", "changed", "services_added", "services_removed")}
