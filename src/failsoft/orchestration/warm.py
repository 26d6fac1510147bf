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
from typing import TYPE_CHECKING, Any

from failsoft.domain import BackupState, ProactivePlan
from failsoft.orchestration.commands import PlanProactive
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.state import WarmRecord

if TYPE_CHECKING:
    from failsoft.orchestration.core import Orchestrator

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WarmTask:
    plan_id: int
    loads: dict[int, tuple[str, str]] = field(default_factory=dict)  # load id -> (app, server)
    planned: bool = False


class WarmBackups:
    """The warm-backup side of :class:`~failsoft.orchestration.core.Orchestrator` (a mixin)."""

    # set by Orchestrator.__init__; declared here because this mixin assigns them
    warm_task: WarmTask | None
    warm_dirty: bool
    _plan_ids: int

    def _start_warm_replan(self: Orchestrator, now: float) -> None:
        if self.warm_task is not None:
            return
        self.warm_dirty = False
        self._plan_ids += 1
        self.warm_task = WarmTask(self._plan_ids)
        scenario = self.state.snapshot(with_warm=False, live_only=True)
        self._out.append(PlanProactive(self._plan_ids, scenario))

    def proactive_planned(
        self: Orchestrator, plan_id: int, plan: ProactivePlan | None, now: float, error: str | None = None
    ) -> list[Any]:
        """The driver ran the proactive policy (``plan`` None: it failed, ``error`` says why)."""
        task = self.warm_task
        if task is None or task.plan_id != plan_id:
            return self._flush(now)
        if plan is None:
            self.warm_task, self.warm_dirty = None, True
            self.last_change = now  # try again once things have been quiet again
            log.warning("proactive planning failed: %s (planned again once quiet)", error)
            return self._flush(now)
        task.planned = True
        desired = {(w.app, w.server): w for w in plan.warm}
        for key, rec in list(self.state.warm.items()):
            if desired.get(key) != rec.backup and not rec.backup.pinned:
                del self.state.warm[key]
                b = rec.backup
                if not self._needed(b.app, b.server, b.variant):
                    self._unload(b.server, b.app, b.variant)
        for key, backup in desired.items():
            if key in self.state.warm:
                continue
            self.state.warm[key] = WarmRecord(backup, BackupState.LOADING)
            load_id = self._load(backup.app, backup.server, backup.variant, Priority.WARM, warm=True)
            task.loads[load_id] = key
        self._publish(force=True)
        self._finish_warm_if_done()
        return self._flush(now)

    def _warm_loaded(self: Orchestrator, load_id: int, ok: bool, app: str, server: str, variant: str) -> None:
        task = self.warm_task
        if task is not None:
            task.loads.pop(load_id, None)
        rec = self.state.warm.get((app, server))
        if ok and rec is not None and rec.backup.variant == variant:
            rec.state = BackupState.WARM
        elif not ok:
            if rec is not None and rec.backup.variant == variant and rec.state is BackupState.LOADING:
                del self.state.warm[(app, server)]
        elif not self._needed(app, server, variant):
            self._unload(server, app, variant)
        self._finish_warm_if_done()

    def _finish_warm_if_done(self: Orchestrator) -> None:
        task = self.warm_task
        if task is not None and task.planned and not task.loads:
            self.warm_task = None
            self._publish(force=True)

    def _warm_loading(self: Orchestrator, app: str) -> bool:
        task = self.warm_task
        return task is not None and any(a == app for a, _ in task.loads.values())
