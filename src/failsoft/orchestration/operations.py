"""Per-app operations: recover, upgrade, go home, repair. At most one per app at a time.

An operation is a small state machine the core advances as its loads finish:

* **recover** (a progressive or cold action of a failover plan, FailLite 3.3): load the first
  variant on its stand-in server, route to it (the app is recovered: MTTR stops here); when the plan
  was progressive, wait until every app of the same failover is served, then *upgrade*;
* **upgrade**: take the final server's upgrade turn (one upgrade at a time per server), load the
  final variant in the background, switch the route, unload the stand-in after a drain period;
* **home**: load the app's home variant on its returning server and move its traffic back;
* **repair**: reload in place a routed model a live server lost (``Orchestrator.model_lost``),
  the app unrouted meanwhile; routed there again once loaded (a ``failover`` of kind ``reload``).

A failure of any server an operation works with cancels it; its load is orphaned (what it loads
anyway is unloaded when nobody needs it). A failed load backs the app off (0.5 s, doubling to 30 s)
before it is planned again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failsoft.domain import ActionKind, FailoverAction, Placement
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.settings import OrchestrationSettings
from failsoft.orchestration.state import RouteKind


class OpKind(StrEnum):
    RECOVER = "recover"
    UPGRADE = "upgrade"
    HOME = "home"
    REPAIR = "repair"


@dataclass(eq=False)
class Group:
    """The apps of one failover still to be served: their upgrades wait until it is empty."""

    waiting: set[str]
    parked: list[Op] = field(default_factory=list)  # operations whose upgrade waits for the group


@dataclass(eq=False)
class Op:
    app: str
    kind: OpKind
    servers: frozenset[str]  # a failure of any of them cancels the operation
    load_id: int | None = None
    action: FailoverAction | None = None  # recover
    detected_at: float | None = None  # recover: the failure its route answers; repair: the loss
    group: Group | None = None  # recover: its failover's group
    current: Placement | None = None  # upgrade: serving now
    goal: Placement | None = None  # upgrade, home, repair: where it goes
    event: str | None = None  # home: the event to emit ("restore"), None when deploying
    has_turn: bool = False  # upgrade: holds its server's upgrade turn
    priority: Priority | None = None  # home: the load's priority (None: PRIMARY)


class Operations:
    """The per-app operations of the :class:`~failsoft.orchestration.core.Orchestrator`.

    It owns the operations under way (``ops``: at most one per app), each server's upgrade turn
    (``upgrading``) and the queue waiting for it, and the apps backing off after a failed load
    (``backoff``). It acts through the core's :class:`~failsoft.orchestration.effects.Effects`, and
    calls ``routes_moved_home`` when a return home moved an app's traffic (warm backups are then
    re-planned). The core starts operations, hands them their finished loads (:meth:`loaded`) and
    cancels those a failure touches (:meth:`cancel`).
    """

    def __init__(
        self,
        effects: Effects,
        settings: OrchestrationSettings,
        routes_moved_home: Callable[[], None],
        home_ended: Callable[[Op, bool, float], None] = lambda op, ok, now: None,
    ) -> None:
        self.fx, self.settings, self._moved_home = effects, settings, routes_moved_home
        self._home_ended = home_ended  # a deploy hears how the returns home it started ended
        self.state = effects.state
        self.ops: dict[str, Op] = {}
        self.upgrading: dict[str, str] = {}  # server -> app holding its upgrade turn
        self.upgrade_queue: dict[str, list[Op]] = {}
        self.backoff: dict[str, tuple[float, int]] = {}  # app -> (retry not before, failures)

    def __contains__(self, app: object) -> bool:
        """Whether an operation of ``app`` is under way."""
        return app in self.ops

    def __len__(self) -> int:
        return len(self.ops)

    def waiting_for(self, app: str, load_id: int) -> Op | None:
        """The operation of ``app`` whose load is ``load_id`` (None: no operation waits for it)."""
        op = self.ops.get(app)
        return op if op is not None and op.load_id == load_id else None

    def works_with(self, app: str, servers: set[str]) -> bool:
        """Whether the operation of ``app`` (if any) works with one of ``servers``."""
        op = self.ops.get(app)
        return op is not None and bool(op.servers & servers)

    def working_with(self, servers: set[str]) -> set[str]:
        """The apps whose operation works with one of ``servers`` now (see :meth:`works_with`)."""
        return {app for app, op in self.ops.items() if op.servers & servers}

    def server_failed(self, server: str) -> None:
        """``server`` failed: nobody holds its upgrade turn any more (its operations are cancelled)."""
        self.upgrading.pop(server, None)

    # starting ----------------------------------------------------------------------------------
    def _start(self, op: Op, now: float) -> None:
        self.cancel(op.app, now)
        self.ops[op.app] = op
        if op.kind is OpKind.RECOVER:
            self._recover_first(op)
        elif op.kind is OpKind.UPGRADE:
            self._take_turn(op, now)
        else:
            assert op.goal is not None
            priority = Priority.PRIMARY if op.kind is OpKind.HOME else Priority.FAILOVER
            priority = op.priority if op.priority is not None else priority
            op.load_id = self.fx.load(op.app, op.goal.server, op.goal.variant, priority)

    def recover(self, action: FailoverAction, detected_at: float, group: Group, now: float) -> None:
        rec = self.state.apps[action.app]
        # the app's capacity is reserved where it is heading from now on: a plan made while its first
        # load runs must neither count it as affected again nor give that memory to another app
        rec.final = Placement(action.server, action.final_variant)
        servers = frozenset({action.server, action.stand_in_server})
        self._start(
            Op(action.app, OpKind.RECOVER, servers, action=action, detected_at=detected_at, group=group), now
        )

    def resume_upgrade(self, app: str, now: float) -> None:
        """An upgrade not under way (a previous controller left it half done): start it."""
        rec = self.state.apps[app]
        if rec.final is None or rec.route is None or not self.state.live(rec.final.server):
            rec.final = None
            return
        op = Op(
            app,
            OpKind.UPGRADE,
            frozenset({rec.final.server, rec.route.server}),
            current=rec.route,
            goal=rec.final,
        )
        self._start(op, now)

    def return_home(
        self, app: str, now: float, event: str | None = "restore", priority: Priority | None = None
    ) -> Op:
        """Load ``app``'s home and move its route there; the operation started."""
        home = self.state.apps[app].home
        op = Op(app, OpKind.HOME, frozenset({home.server}), goal=home, event=event, priority=priority)
        self._start(op, now)
        return op

    def repair(self, app: str, where: Placement, now: float) -> None:
        """Reload ``app`` at ``where``, the route a live server lost (the core unrouted it)."""
        op = Op(app, OpKind.REPAIR, frozenset({where.server}), goal=where, detected_at=now)
        self._start(op, now)

    # cancelling ---------------------------------------------------------------------------------
    def cancel(self, app: str, now: float) -> None:
        """Cancel the operation of ``app``, if any: its load is orphaned, its turn and group left."""
        op = self.ops.pop(app, None)
        if op is None:
            return
        if op.load_id is not None:
            self.fx.orphan(op.load_id)
        self._release_turn(op, now)
        self._leave_group(op, now)
        self.fx.attention.add(app)
        if op.kind is OpKind.HOME:
            self._home_ended(op, False, now)

    def _end(self, op: Op) -> None:
        if self.ops.get(op.app) is op:
            del self.ops[op.app]
        self.fx.attention.add(op.app)

    # loads finishing ----------------------------------------------------------------------------
    def loaded(self, op: Op, ok: bool, info: dict[str, Any], now: float) -> None:
        """The load ``op`` waited for finished (``ok``) or failed: take its next step."""
        op.load_id = None
        if op.kind is OpKind.RECOVER:
            self._first_loaded(op, ok, info, now)
        elif op.kind is OpKind.UPGRADE:
            self._final_loaded(op, ok, info, now)
        elif op.kind is OpKind.HOME:
            self._home_loaded(op, ok, info, now)
        else:
            self._repaired(op, ok, info, now)

    # recover ------------------------------------------------------------------------------------
    def _recover_first(self, op: Op) -> None:
        action = op.action
        assert action is not None
        critical = self.state.apps[op.app].app.critical
        priority = Priority.CRITICAL if critical else Priority.FAILOVER
        op.load_id = self.fx.load(op.app, action.stand_in_server, action.first_variant, priority)

    def _first_loaded(self, op: Op, ok: bool, info: dict[str, Any], now: float) -> None:
        action, rec = op.action, self.state.apps[op.app]
        assert action is not None and op.detected_at is not None
        if not ok:
            rec.final = None
            self._back_off(op.app, now)
            self._leave_group(op, now)
            self._end(op)
            return
        self.backoff.pop(op.app, None)
        kind = RouteKind.PROGRESSIVE if action.kind is ActionKind.PROGRESSIVE else RouteKind.COLD
        stand_in = Placement(action.stand_in_server, action.first_variant)
        self.fx.set_route(rec, stand_in, kind, op.detected_at, now)
        self.fx.publish()
        self.fx.failover_event(
            op.app, kind.value, op.detected_at, now,
            load_ms=info.get("load_ms"), load_cpu_ms=info.get("load_cpu_ms"),
            load_phases=info.get("phases"),  # where the load's time went, as the runtime timed it
            final_variant=action.final_variant, final_server=action.server,
        )  # fmt: skip
        self._leave_group(op, now)
        if rec.final is None or rec.final == stand_in:
            rec.final = None
            self._end(op)
            return
        op.kind, op.current, op.goal = OpKind.UPGRADE, stand_in, rec.final
        op.servers = frozenset({rec.final.server, stand_in.server})
        if op.group is not None and op.group.waiting:
            op.group.parked.append(op)  # no upgrade competes with another app's recovery
        else:
            self._take_turn(op, now)

    def _leave_group(self, op: Op, now: float) -> None:
        group = op.group
        if group is None or op.app not in group.waiting:
            return
        group.waiting.discard(op.app)
        if group.waiting:
            return
        parked, group.parked = group.parked, []
        for waiting in parked:
            if self.ops.get(waiting.app) is waiting:
                self._take_turn(waiting, now)

    # upgrade -------------------------------------------------------------------------------------
    def _take_turn(self, op: Op, now: float) -> None:
        assert op.goal is not None
        server = op.goal.server
        if server in self.upgrading:
            self.upgrade_queue.setdefault(server, []).append(op)
            return
        self.upgrading[server] = op.app
        op.has_turn = True
        op.load_id = self.fx.load(op.app, server, op.goal.variant, Priority.UPGRADE)

    def _release_turn(self, op: Op, now: float) -> None:
        if op.goal is None:
            return
        server = op.goal.server
        queue = self.upgrade_queue.get(server, [])
        if op in queue:
            queue.remove(op)
        if not op.has_turn:
            return
        op.has_turn = False
        if self.upgrading.get(server) == op.app:
            del self.upgrading[server]
        while queue:
            nxt = queue.pop(0)
            if self.ops.get(nxt.app) is nxt:
                self._take_turn(nxt, now)
                return

    def _final_loaded(self, op: Op, ok: bool, info: dict[str, Any], now: float) -> None:
        rec = self.state.apps[op.app]
        self._release_turn(op, now)
        assert op.goal is not None and op.current is not None
        if not ok:
            rec.final = None  # stays on what serves it now
            self._end(op)
            return
        self.fx.set_route(rec, op.goal, rec.kind, rec.detected_at, now)
        rec.final = None
        self.fx.publish()
        self.fx.emit(
            "upgrade", op.app, op.goal,
            previous={"server": op.current.server, "variant": op.current.variant},
            previous_variant=op.current.variant, load_ms=info.get("load_ms"),
        )  # fmt: skip
        self._drain(op.app, op.current, now)
        self._end(op)

    # home and repair -----------------------------------------------------------------------------
    def _home_loaded(self, op: Op, ok: bool, info: dict[str, Any], now: float) -> None:
        rec = self.state.apps[op.app]
        if not ok:
            self._back_off(op.app, now)
            self._end(op)
            self._home_ended(op, False, now)
            return
        self.backoff.pop(op.app, None)
        old, home = rec.route, rec.home
        self.fx.set_route(rec, home, RouteKind.PRIMARY, None, now)
        rec.final = None
        self.fx.publish()
        if op.event:
            self.fx.emit(
                op.event, op.app, home,
                previous=None if old is None else {"server": old.server, "variant": old.variant},
                reloaded=not info.get("cached", False), load_ms=info.get("load_ms"),
            )  # fmt: skip
        self._moved_home()
        if old is not None and old != home and (op.app, old.server) not in self.state.warm:
            self._drain(op.app, old, now)
        self._end(op)
        self._home_ended(op, True, now)

    def _repaired(self, op: Op, ok: bool, info: dict[str, Any], now: float) -> None:
        """The reload in place finished: the app, unrouted meanwhile, is routed there again (a new
        route: the requests that found the model gone retry on it), or stays unrouted and backs
        off (a return home follows when its home is up)."""
        rec = self.state.apps[op.app]
        assert op.goal is not None
        if rec.route not in (None, op.goal):  # routed elsewhere meanwhile: nothing to restore
            self._end(op)
            return
        self.fx.set_route(rec, op.goal if ok else None, rec.kind, rec.detected_at, now)
        rec.final = None  # reserved there while it reloaded
        self.fx.publish()
        if ok:
            self.backoff.pop(op.app, None)
            lost_at = now if op.detected_at is None else op.detected_at
            self.fx.failover_event(
                op.app, "reload", lost_at, now, cause="model_lost", load_ms=info.get("load_ms")
            )
        else:
            self._back_off(op.app, now)
        self._end(op)

    # helpers ------------------------------------------------------------------------------------
    def _back_off(self, app: str, now: float) -> None:
        """An operation of ``app`` failed: plan it again later, backing off up to the maximum."""
        _, failures = self.backoff.get(app, (0.0, 0))
        s = self.settings
        until = now + min(s.backoff_max_s, s.backoff_base_s * 2**failures)
        self.backoff[app] = (until, failures + 1)
        self.fx.wake_at(until, ("attend", app))

    def backing_off(self, app: str, now: float) -> bool:
        """Whether ``app`` is still backing off at ``now`` (a load of it failed): not planned yet."""
        until, _ = self.backoff.get(app, (0.0, 0))
        return now < until

    def _drain(self, app: str, where: Placement, now: float) -> None:
        """Unload ``where`` once the requests still on their way to it are answered (drain period)."""
        self.fx.wake_at(now + self.settings.drain_s, ("drain", (app, where.server, where.variant)))
