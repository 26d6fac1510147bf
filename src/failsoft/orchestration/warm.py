"""Re-planning warm backups (FailLite 3.2, 3.4) once a recovery has settled.

After a failover, a restore or a deployment the warm backups no longer match the cluster: some were
consumed by warm switches, some sat on failed servers, capacity moved. The core asks the proactive
policy for a new plan on the live cluster (:class:`~failsoft.orchestration.commands.PlanProactive`)
only when nothing else is under way and no route changed for ``replan_delay_s``: reloading backups
must not take the CPU from a recovery. The new plan is applied as a difference: backups it drops are
unloaded (unless their model serves the app now), new ones load at the lowest priority but one, and
a backup counts as warm once its load finished. Pinned backups (a mechanism's own) are never dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from failsoft.domain import BackupState, ProactivePlan
from failsoft.orchestration.commands import PlanProactive
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.state import WarmRecord

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WarmTask:
    plan_id: int
    loads: dict[int, tuple[str, str]] = field(default_factory=dict)  # load id -> (app, server)
    planned: bool = False


class WarmBackups:
    """The warm-backup side of the :class:`~failsoft.orchestration.core.Orchestrator`.

    It owns ``dirty`` (the backups may no longer fit the cluster: re-plan them once quiet) and
    ``task`` (the re-plan under way: its plan id and the backup loads it still waits for), and acts
    through the core's :class:`~failsoft.orchestration.effects.Effects`. The core decides *when* to
    re-plan (:meth:`start`), hands it the plan (:meth:`planned`) and the backups' finished loads
    (:meth:`loaded`), and marks it dirty when capacity moved.
    """

    def __init__(self, effects: Effects) -> None:
        self.fx, self.state = effects, effects.state
        self.task: WarmTask | None = None
        self.dirty = True

    def mark_dirty(self) -> None:
        """Capacity moved (a failure, a return home, a server back): re-plan once all is quiet."""
        self.dirty = True

    @property
    def busy(self) -> bool:
        """A re-plan is under way (asked for, or its backups still loading)."""
        return self.task is not None

    def start(self) -> None:
        """Ask for a proactive plan of the live cluster (unless one is under way)."""
        if self.task is not None:
            return
        self.dirty = False
        self.task = WarmTask(self.fx.next_plan_id())
        scenario = self.state.snapshot(with_warm=False, live_only=True)
        self.fx.send(PlanProactive(self.task.plan_id, scenario))

    def planned(self, plan_id: int, plan: ProactivePlan | None, now: float, error: str | None = None) -> None:
        """The driver ran the proactive policy (``plan`` None: it failed, ``error`` says why)."""
        task = self.task
        if task is None or task.plan_id != plan_id:
            return
        if plan is None:
            self.task, self.dirty = None, True
            self.fx.last_change = now  # try again once things have been quiet again
            log.warning("proactive planning failed: %s (planned again once quiet)", error)
            return
        task.planned = True
        desired = {(w.app, w.server): w for w in plan.warm}
        for key, rec in list(self.state.warm.items()):
            if desired.get(key) != rec.backup and not rec.backup.pinned:
                del self.state.warm[key]
                b = rec.backup
                if not self.fx.needed(b.app, b.server, b.variant):
                    self.fx.unload(b.server, b.app, b.variant)
        for key, backup in desired.items():
            if key in self.state.warm:
                continue
            self.state.warm[key] = WarmRecord(backup, BackupState.LOADING)
            load_id = self.fx.load(backup.app, backup.server, backup.variant, Priority.WARM, warm=True)
            task.loads[load_id] = key
        self.fx.publish(force=True)
        self.finish_if_done()

    def loaded(self, load_id: int, ok: bool, app: str, server: str, variant: str) -> None:
        """A backup's load finished (``ok``) or failed."""
        task = self.task
        if task is not None:
            task.loads.pop(load_id, None)
        rec = self.state.warm.get((app, server))
        if ok and rec is not None and rec.backup.variant == variant:
            rec.state = BackupState.WARM
        elif not ok:
            if rec is not None and rec.backup.variant == variant and rec.state is BackupState.LOADING:
                del self.state.warm[(app, server)]
        elif not self.fx.needed(app, server, variant):
            self.fx.unload(server, app, variant)
        self.finish_if_done()

    def forget_load(self, load_id: int) -> None:
        """A backup's load will never finish (its server failed): the re-plan stops waiting for it."""
        if self.task is not None:
            self.task.loads.pop(load_id, None)

    def finish_if_done(self) -> None:
        task = self.task
        if task is not None and task.planned and not task.loads:
            self.task = None
            self.fx.publish(force=True)

    def loading(self, app: str) -> bool:
        """Whether a backup of ``app`` is loading for the re-plan under way."""
        task = self.task
        return task is not None and any(a == app for a, _ in task.loads.values())
