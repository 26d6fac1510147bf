"""Applying plans to the cluster: warm switches, progressive loads, restores (FailLite 3.3-3.4, 4).

The policies decide; the orchestrator makes it so, with the agents, and tells the gateway (routes)
and the clients (events) as each step lands:

* **failure** of servers: the apps they served lose their route at once (the gateway holds their
  requests instead of sending them to a dead server), warm backups on them are lost, and the policy
  plans the failover on the new snapshot;
* **warm** actions switch the route at once (one route version for all of them); warm backups the
  plan *releases* are unloaded before any load starts;
* **progressive** actions load ``first_variant`` on its stand-in server (the final server, or another
  one with room), route to it (the app is recovered: MTTR stops here), then, once every app of the
  same failover is served again, load ``final_variant`` in the background (one upgrade at a time
  per server), switch, and unload the small one after a drain period; **cold** actions (the
  baselines) load the final variant and route to it;
* **restore**: a server that heartbeats again is cleaned of what it should no longer hold; then each
  app whose home is there is loaded back and its traffic returns (``restore`` event);
* warm backups are re-planned (and the difference loaded) once nothing else is under way and no
  route has changed for ``replan_delay_s``: reloading backups must not slow a recovery down.

Each app has at most one operation at a time (a task in :attr:`Orchestrator.ops`); a failure cancels
the operations that touch the failed servers. Every load goes through the server's
:class:`~failsoft.runtime.gates.LoadGate`, by priority. A periodic reconcile pass repairs whatever a
lost message or a crash left behind (models held but not needed, routes to models not held).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from failsoft.domain import ActionKind, BackupState, FailoverAction, FailoverPlan, Placement, ServerState
from failsoft.errors import FailsoftError
from failsoft.policies.failover.common import affected_apps, initial_ledger, warm_switches
from failsoft.runtime.cluster import AgentRef
from failsoft.runtime.config import AgentSettings
from failsoft.runtime.gates import LoadGate, Priority
from failsoft.runtime.loop import spawn
from failsoft.runtime.planner import Planner
from failsoft.runtime.state import AppRecord, ClusterState, RouteKind, WarmRecord

log = logging.getLogger(__name__)


class Orchestrator:
    """Turns plans and health changes into agent calls, routes and events."""

    def __init__(
        self,
        state: ClusterState,
        planner: Planner,
        settings: AgentSettings,
        agent: Callable[[str], AgentRef],
        publish: Callable[[], None],
        emit: Callable[..., None],
        replan_delay_s: float = 3.0,
    ) -> None:
        self.state, self.planner, self.settings = state, planner, settings
        self.agent, self.publish, self.emit = agent, publish, emit
        self.gates = {s: LoadGate(settings.max_parallel_loads) for s in state.servers}
        self.upgrade_locks = {s: asyncio.Lock() for s in state.servers}
        self.plan_lock = asyncio.Lock()
        self.ops: dict[str, asyncio.Task[Any]] = {}
        self.op_target: dict[str, str] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.warm_task: asyncio.Task[Any] | None = None
        self.warm_dirty = True
        self.replan_delay_s = replan_delay_s
        self.last_change = 0.0  # monotonic time of the last failover, upgrade or restore
        self.last_plan: dict[str, Any] | None = None
        self.backoff: dict[str, tuple[float, int]] = {}  # app -> (retry not before, failures)
        self.unrecovered: set[str] = set()

    # agent calls -----------------------------------------------------------------------------
    async def load(self, server: str, app: str, variant: str, priority: Priority) -> dict[str, Any]:
        family = self.state.apps[app].app.family
        background = priority >= Priority.WARM  # warm backups and upgrades yield the CPU
        async with self.gates[server].slot(priority):
            info = await self.agent(server).load(app, family, variant, background)
        self.state.servers[server].holdings.add((app, variant))
        return info

    async def unload(self, server: str, app: str, variant: str) -> None:
        self.state.servers[server].holdings.discard((app, variant))
        try:
            await self.agent(server).unload(app, variant)
        except FailsoftError as exc:  # a dead server holds nothing worth unloading
            log.info("unload of %s/%s on %s skipped: %s", app, variant, server, exc)

    # operations, one per app -------------------------------------------------------------------
    def start_op(self, app: str, coro: Any, target: str) -> None:
        self.cancel_op(app)
        self.op_target[app] = target
        task = spawn(coro, f"op:{app}", self.tasks)
        self.ops[app] = task

        def _done(t: asyncio.Task[Any], app: str = app) -> None:
            if self.ops.get(app) is t:
                del self.ops[app]
                self.op_target.pop(app, None)

        task.add_done_callback(_done)

    def cancel_op(self, app: str) -> None:
        task = self.ops.pop(app, None)
        self.op_target.pop(app, None)
        if task is not None:
            task.cancel()

    def _failed(self, app: str) -> None:
        """An operation of ``app`` failed: retry it later, backing off up to 30 s."""
        _, failures = self.backoff.get(app, (0.0, 0))
        self.backoff[app] = (time.monotonic() + min(30.0, 0.5 * 2**failures), failures + 1)

    def _backing_off(self, app: str) -> bool:
        until, _ = self.backoff.get(app, (0.0, 0))
        return time.monotonic() < until

    @property
    def busy(self) -> bool:
        return bool(self.ops) or (self.warm_task is not None and not self.warm_task.done())

    def _route(self, rec: AppRecord, where: Placement, kind: RouteKind, detected_at: float | None) -> None:
        rec.route, rec.kind, rec.detected_at, rec.route_at = where, kind, detected_at, time.time()
        self.last_change = time.monotonic()
        self.unrecovered.discard(rec.app.name)

    def _event(self, event_type: str, app: str, where: Placement | None, **extra: Any) -> None:
        accuracy = None if where is None else self.state.variant(app, where.variant).accuracy
        self.emit(
            event_type,
            app=app,
            server=None if where is None else where.server,
            variant=None if where is None else where.variant,
            accuracy=accuracy,
            **extra,
        )

    # failures --------------------------------------------------------------------------------
    def fail_servers(
        self, servers: Iterable[str], detected_at: float, last_heard: dict[str, float] | None = None
    ) -> None:
        """Servers are failed: unroute their apps, switch those with a warm backup to it at once,
        drop the failed servers' warm backups, cancel what touches them; one route update for all."""
        failed = set(servers)
        hit = self._unroute(failed, detected_at)
        switched = self._switch_to_warm(detected_at)
        self.publish()
        for server, apps in hit.items():
            heard = (last_heard or {}).get(server)
            for app, where in apps:
                self._event("failure", app, where, detected_at=detected_at, last_heartbeat_at=heard)
            if not apps:
                self.emit(
                    "failure", app=None, server=server, variant=None, accuracy=None,
                    detected_at=detected_at, last_heartbeat_at=heard,
                )  # fmt: skip
        for action in switched:
            route = self.state.apps[action.app].route
            self._event(
                "failover",
                action.app,
                route,
                kind="warm",
                detected_at=detected_at,
                route_ms=_ms_since(detected_at),
            )

    def _unroute(self, failed: set[str], detected_at: float) -> dict[str, list[tuple[str, Placement]]]:
        """Mark servers failed; the apps each was serving (now without a route)."""
        for name in failed:
            rec = self.state.servers[name]
            rec.state, rec.failed_at = ServerState.FAILED, detected_at
        for key in [k for k in self.state.warm if k[1] in failed]:
            del self.state.warm[key]
            self.warm_dirty = True
        hit: dict[str, list[tuple[str, Placement]]] = {s: [] for s in failed}
        for name, rec in self.state.apps.items():
            if self.op_target.get(name) in failed or (rec.final and rec.final.server in failed):
                self.cancel_op(name)
                rec.final = None
            if rec.route is not None and rec.route.server in failed:
                hit[rec.route.server].append((name, rec.route))
                rec.route, rec.final = None, None
                self.cancel_op(name)
        return hit

    def _switch_to_warm(self, detected_at: float) -> list[FailoverAction]:
        """FailLite's first reaction: an affected app with a live warm backup switches to it now,
        before any planning (the same choice every policy makes: the most accurate live backup)."""
        down = self.state.down()
        scenario = self.state.snapshot()
        affected = [a for a in affected_apps(scenario, down) if a.name not in self.ops]
        actions, _ = warm_switches(scenario, affected, down, initial_ledger(scenario, down))
        for action in actions:
            rec = self.state.apps[action.app]
            self._route(rec, Placement(action.server, action.final_variant), RouteKind.WARM, detected_at)
            self.state.warm.pop((action.app, action.server), None)
        if actions:
            self.warm_dirty = True
        return actions

    async def plan_failover(self, detected_at: float) -> FailoverPlan | None:
        """Plan and start the recovery of every app whose placement is on a down server."""
        async with self.plan_lock:
            down = self.state.down()
            scenario = self.state.snapshot()
            pending = {a.name for a in scenario.apps if a.primary and a.primary.server in down} - set(
                self.ops
            )
            if not pending:
                return None
            plan = await self.planner.failover(scenario, down)
            self.last_plan = plan.to_dict()
            failed_at = {  # the MTTR of an app counts from the detection of *its* server's failure
                a.name: self.state.servers[a.primary.server].failed_at or detected_at
                for a in scenario.apps
                if a.name in pending and a.primary is not None
            }
            await self._execute(plan, failed_at)
            return plan

    async def _execute(self, plan: FailoverPlan, failed_at: dict[str, float]) -> None:
        actions = [a for a in plan.actions if a.app in failed_at]
        warm = [a for a in actions if a.kind is ActionKind.WARM]
        for action in warm:
            rec = self.state.apps[action.app]
            where = Placement(action.server, action.final_variant)
            self._route(rec, where, RouteKind.WARM, failed_at[action.app])
            self.state.warm.pop((action.app, action.server), None)
        if warm:
            self.publish()
        for action in warm:
            at = failed_at[action.app]
            route = self.state.apps[action.app].route
            self._event("failover", action.app, route, kind="warm", detected_at=at, route_ms=_ms_since(at))
        for backup in plan.released:
            self.state.warm.pop((backup.app, backup.server), None)
        await asyncio.gather(*(self.unload(b.server, b.app, b.variant) for b in plan.released))
        loads = [a for a in actions if a.kind is not ActionKind.WARM]
        served = _Countdown(len(loads))  # upgrades wait until every app of this failover is served
        for action in loads:
            self.start_op(action.app, self._recover(action, failed_at[action.app], served), action.server)
        for app in plan.unrecovered:
            if app in failed_at and app not in self.unrecovered:
                self.unrecovered.add(app)  # said once per outage, not at every retry
                self.emit("unrecovered", app=app, server=None, variant=None, accuracy=None)
        self.warm_dirty = True

    async def _recover(self, action: FailoverAction, detected_at: float, served: _Countdown) -> None:
        rec = self.state.apps[action.app]
        server, first, final = action.server, action.first_variant, action.final_variant
        stand_in = Placement(action.stand_in_server, first)  # where the first variant serves
        kind = RouteKind.PROGRESSIVE if action.kind is ActionKind.PROGRESSIVE else RouteKind.COLD
        rec.final = Placement(server, final) if stand_in != Placement(server, final) else None
        priority = Priority.CRITICAL if rec.app.critical else Priority.FAILOVER
        try:
            info = await self.load(stand_in.server, action.app, first, priority)
        except FailsoftError as exc:
            rec.final = None
            self._failed(action.app)
            log.warning("failover of %s to %s failed: %s (planned again)", action.app, stand_in.server, exc)
            return
        finally:
            served.arrive()
        self.backoff.pop(action.app, None)
        self._route(rec, stand_in, kind, detected_at)
        self.publish()
        self._event(
            "failover", action.app, rec.route, kind=kind.value, detected_at=detected_at,
            route_ms=_ms_since(detected_at), load_ms=info.get("load_ms"), final_variant=final,
            final_server=server,
        )  # fmt: skip
        if rec.final is not None:
            await served.wait()  # no upgrade competes with another app's recovery
            await self._upgrade(action.app, stand_in, rec.final)

    async def _upgrade(self, app: str, current: Placement, target: Placement) -> None:
        """Load the target variant in the background, switch to it, unload the stand-in."""
        rec = self.state.apps[app]
        try:
            async with self.upgrade_locks[target.server]:
                info = await self.load(target.server, app, target.variant, Priority.UPGRADE)
        except FailsoftError as exc:
            rec.final = None
            log.warning("upgrade of %s to %s failed: %s (stays on %s)", app, target, exc, current)
            return
        self._route(rec, target, rec.kind, rec.detected_at)
        rec.final = None
        self.publish()
        self._event(
            "upgrade", app, target, previous={"server": current.server, "variant": current.variant},
            previous_variant=current.variant, load_ms=info.get("load_ms"),
        )  # fmt: skip
        await asyncio.sleep(self.settings.drain_ms / 1000.0)
        if not self._in_use(app, current.server, current.variant):
            await self.unload(current.server, app, current.variant)

    def resume_upgrade(self, app: str) -> None:
        """An upgrade a previous controller left half done (``final`` set, no operation running)."""
        rec = self.state.apps[app]
        if rec.final is None or rec.route is None or not self.state.live(rec.final.server):
            rec.final = None
            return
        self.start_op(app, self._upgrade(app, rec.route, rec.final), rec.final.server)

    # restores --------------------------------------------------------------------------------
    async def clean_returning(self, server: str) -> None:
        """A server is back: learn what it holds and unload all but its apps' home variants."""
        info = await self.agent(server).holdings()
        rec = self.state.servers[server]
        rec.incarnation, rec.pid = info["incarnation"], info.get("pid")
        rec.holdings = {(a, v) for a, v in info["models"]}
        keep = {(a, r.home.variant) for a, r in self.state.apps.items() if r.home.server == server}
        await asyncio.gather(*(self.unload(server, a, v) for a, v in rec.holdings - keep))

    def return_home(self, app: str, event: str | None = "restore") -> None:
        self.start_op(app, self._go_home(app, event), self.state.apps[app].home.server)

    async def _go_home(self, app: str, event: str | None) -> None:
        rec = self.state.apps[app]
        home = rec.home
        try:
            info = await self.load(home.server, app, home.variant, Priority.PRIMARY)
        except FailsoftError as exc:
            self._failed(app)
            log.warning("loading %s at home on %s failed: %s", app, home.server, exc)
            return
        self.backoff.pop(app, None)
        old = rec.route
        self._route(rec, home, RouteKind.PRIMARY, None)
        rec.final = None
        self.publish()
        if event:
            self._event(
                event,
                app,
                home,
                previous=None if old is None else {"server": old.server, "variant": old.variant},
                reloaded=not info.get("cached", False),
                load_ms=info.get("load_ms"),
            )
        self.warm_dirty = True
        if (
            old is not None
            and old != home
            and self.state.live(old.server)
            and (app, old.server) not in self.state.warm
        ):
            await asyncio.sleep(self.settings.drain_ms / 1000.0)
            await self.unload(old.server, app, old.variant)

    # warm backups ------------------------------------------------------------------------------
    def start_warm_replan(self) -> None:
        if self.warm_task is None or self.warm_task.done():
            self.warm_dirty = False
            self.warm_task = spawn(self.replan_warm(), "warm-replan", self.tasks)

    async def replan_warm(self) -> None:
        """Proactive plan on the live cluster, applied as a diff: unload the dropped, load the new."""
        scenario = self.state.snapshot(with_warm=False, live_only=True)
        plan = await self.planner.proactive(scenario)
        desired = {(w.app, w.server): w for w in plan.warm}
        dropped = [
            self.state.warm.pop(key).backup
            for key, rec in list(self.state.warm.items())
            if desired.get(key) != rec.backup
        ]
        await asyncio.gather(
            *(
                self.unload(b.server, b.app, b.variant)
                for b in dropped
                if not self._in_use(b.app, b.server, b.variant)
            )
        )
        new = [w for key, w in desired.items() if key not in self.state.warm]
        for w in new:
            self.state.warm[(w.app, w.server)] = WarmRecord(w, BackupState.LOADING)
        self.publish()
        await asyncio.gather(*(self._load_warm(w.app, w.server, w.variant) for w in new))
        self.publish()

    def _in_use(self, app: str, server: str, variant: str) -> bool:
        rec = self.state.apps[app]
        return any(p is not None and p == Placement(server, variant) for p in (rec.route, rec.final))

    async def _load_warm(self, app: str, server: str, variant: str) -> None:
        try:
            await self.load(server, app, variant, Priority.WARM)
        except FailsoftError as exc:
            log.warning("warm backup of %s on %s failed: %s", app, server, exc)
            self.state.warm.pop((app, server), None)
            return
        rec = self.state.warm.get((app, server))
        if rec is not None and rec.backup.variant == variant:
            rec.state = BackupState.WARM
        elif not self._in_use(app, server, variant):
            await self.unload(server, app, variant)

    # reconcile -------------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """Start what the state calls for; True when unrouted apps wait for a failover plan."""
        needs_plan = False
        for name, rec in self.state.apps.items():
            if name in self.ops or self._backing_off(name):
                continue
            home_live = self.state.servers[rec.home.server].state is ServerState.UP
            if rec.final is not None:
                self.resume_upgrade(name)
            elif rec.route != rec.home and home_live:
                self.return_home(name)
            elif rec.route is None:
                needs_plan = True
        settled = time.monotonic() - self.last_change >= self.replan_delay_s
        if self.warm_dirty and settled and not self.busy and not needs_plan:
            self.start_warm_replan()  # backups reload only once recovery has settled (it needs the CPU)
        return needs_plan

    async def collect_garbage(self) -> None:
        """Compare each live server's holdings with what it must hold: unload extras, repair losses."""
        for server, rec in self.state.servers.items():
            if rec.state is not ServerState.UP:
                continue
            try:
                info = await self.agent(server).holdings(timeout_s=2.0)
            except FailsoftError:
                continue
            held = {(a, v) for a, v in info["models"]}
            rec.holdings, rec.incarnation, rec.pid = set(held), info["incarnation"], info.get("pid")
            for app, variant in held - self.state.needed_on(server):
                idle = app not in self.ops and not self._warm_loading(app)
                if idle and (app, variant) not in self.state.needed_on(server):  # checked again: we awaited
                    await self.unload(server, app, variant)
            for app, variant in self.state.needed_on(server) - held:
                route = self.state.apps[app].route
                if app not in self.ops and route == Placement(server, variant):
                    log.warning("server %s lost %s/%s: reloading it", server, app, variant)
                    self.start_op(app, self._repair(app, route), server)

    def _warm_loading(self, app: str) -> bool:
        return any(w.state is BackupState.LOADING for w in self.state.warm_of(app))

    async def _repair(self, app: str, where: Placement) -> None:
        try:
            await self.load(where.server, app, where.variant, Priority.FAILOVER)
        except FailsoftError as exc:
            log.warning("repair of %s on %s failed: %s", app, where.server, exc)
            rec = self.state.apps[app]
            if rec.route == where:
                rec.route = None
                self.publish()


class _Countdown:
    """Set once ``n`` arrivals happened (at once when ``n`` is 0)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.done = asyncio.Event()
        if n <= 0:
            self.done.set()

    def arrive(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.done.set()

    async def wait(self) -> None:
        await self.done.wait()


def _ms_since(wall: float) -> float:
    return round((time.time() - wall) * 1000.0, 3)
