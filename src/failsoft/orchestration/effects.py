"""What the core's parts do to the cluster, in one place: commands out, loads, routes, timers.

The :class:`~failsoft.orchestration.core.Orchestrator` holds two collaborators,
:class:`~failsoft.orchestration.operations.Operations` and
:class:`~failsoft.orchestration.warm.WarmBackups`. All three act on the cluster the same few ways,
and each such act has bookkeeping that must never be skipped: a load gets an id and a slot in the
server's :class:`~failsoft.orchestration.loads.LoadQueue`; a route change marks the app routed or
not and is published once; an unload counts as freed capacity. :class:`Effects` is those acts, and
the state they keep. Each part is given the one instance, so the parts share no attributes and
none reaches into another: what they share is below them, in this module.

Nothing here decides anything; the outbox it fills is what the core's inputs return.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from failsoft.domain import Placement
from failsoft.orchestration.commands import Command, Emit, Load, Publish, Unload
from failsoft.orchestration.loads import LoadQueue, Priority, is_heavy
from failsoft.orchestration.state import AppRecord, ClusterState, RouteKind


@dataclass(eq=False)
class LoadJob:
    """A :class:`~failsoft.orchestration.commands.Load` asked for: queued, then started, then done."""

    load_id: int
    server: str
    app: str
    variant: str
    priority: Priority
    warm: bool
    family: str
    pinned: bool = False  # a mechanism's copy (:mod:`~failsoft.orchestration.copies`)
    started: bool = False
    orphan: bool = False  # the operation waiting for it is gone: what it loads is unwanted


class Effects:
    """The core's acts on the cluster and their bookkeeping; see the module docstring.

    State kept here, read by every part: ``unrouted`` (apps without a route), ``unrecovered`` (apps
    said to be unrecoverable in this outage), ``last_change`` (when a route last changed),
    ``changes`` (grows whenever capacity may have been freed), ``attention`` (apps to look at in the
    next reconciliation), and the load jobs and timers under way.
    """

    def __init__(
        self,
        state: ClusterState,
        load_slots: int,
        now: float,
        heavy_load_slots: int | None = None,
        heavy_per_host: bool = False,
    ) -> None:
        self.state = state
        self.loads = LoadQueue(list(state.servers), load_slots, heavy_load_slots, heavy_per_host)
        self.jobs: dict[int, LoadJob] = {}
        self.unrouted: set[str] = {n for n, r in state.apps.items() if r.route is None}
        self.unrecovered: set[str] = set()
        self.last_change = now
        # grows whenever capacity may have been freed (unloads, failures, servers back, back-offs
        # over): apps left without a route are planned again only then, not in a loop
        self.changes = 0
        self.attention: set[str] = set()
        self._out: list[Command] = []
        self._changed_routes: list[str] = []
        self._load_ids = itertools.count(1)
        self._plan_ids = itertools.count(1)
        self._timers: list[tuple[float, int, str, Any]] = []
        self._timer_seq = itertools.count()

    # the outbox ---------------------------------------------------------------------------------
    def send(self, command: Command) -> None:
        self._out.append(command)

    def take(self) -> list[Command]:
        """The commands sent since the last call, in order (the core returns them from an input)."""
        out, self._out = self._out, []
        return out

    def next_plan_id(self) -> int:
        """One numbering for failover and proactive plans, so that an id names one request."""
        return next(self._plan_ids)

    def emit(self, event: str, app: str | None, where: Placement | None, **extra: Any) -> None:
        accuracy = None if where is None or app is None else self.state.variant(app, where.variant).accuracy
        fields = {
            "app": app,
            "server": None if where is None else where.server,
            "variant": None if where is None else where.variant,
            "accuracy": accuracy,
        }
        self._out.append(Emit(event, fields | extra))

    def failover_event(self, app: str, kind: str, detected_at: float, now: float, **extra: Any) -> None:
        """``app`` is served again after a failure detected at ``detected_at`` (its route is set)."""
        rec = self.state.apps[app]
        where = rec.route
        self.emit(
            "failover",
            app,
            where,
            kind=kind,
            detected_at=detected_at,
            route_ms=_ms(now - detected_at),
            **extra,
        )
        if where is not None:
            rec.last_failover = {"at": now, "kind": kind, "server": where.server, "variant": where.variant}

    # routes -------------------------------------------------------------------------------------
    def set_route(
        self, rec: AppRecord, where: Placement | None, kind: RouteKind, detected_at: float | None, now: float
    ) -> None:
        name = rec.app.name
        rec.route, rec.kind, rec.detected_at = where, kind, detected_at
        if where is None:
            self.unrouted.add(name)
        else:
            rec.route_at = now
            self.last_change = now
            self.unrouted.discard(name)
            self.unrecovered.discard(name)
        self._changed_routes.append(name)

    def publish(self, force: bool = False) -> None:
        """One :class:`Publish` for the routes changed since the last (``force``: even for none)."""
        if self._changed_routes or force:
            self._out.append(Publish(tuple(dict.fromkeys(self._changed_routes))))
            self._changed_routes = []

    # loads and unloads --------------------------------------------------------------------------
    def load(
        self,
        app: str,
        server: str,
        variant: str,
        priority: Priority,
        warm: bool = False,
        pinned: bool = False,
    ) -> int:
        """Ask for a load; it is sent now if a slot of ``server`` is free, else when one frees."""
        load_id = next(self._load_ids)
        family = self.state.apps[app].app.family
        job = LoadJob(load_id, server, app, variant, priority, warm or pinned, family, pinned)
        self.jobs[load_id] = job
        profile = self.state.variant(app, variant)
        if self.loads.submit(server, load_id, priority, profile.load_ms, is_heavy(profile)):
            self._send_load(job)
        return load_id

    def finish_load(self, load_id: int) -> LoadJob | None:
        """A load ended: free its slot, send the loads that take it; its job (None: forgotten)."""
        job = self.jobs.pop(load_id, None)
        for started in self.loads.finish(load_id):
            self._send_load(self.jobs[started])
        return job

    def clear_loads(self, server: str) -> list[LoadJob]:
        """``server`` failed: its loads, queued or running, are forgotten; their jobs."""
        jobs = [self.jobs.pop(load_id, None) for load_id in self.loads.clear(server)]
        if self.loads.heavy_per_host:  # its heavy loads held the host's slots: others may start
            for started in self.loads.admit():
                self._send_load(self.jobs[started])
        return [job for job in jobs if job is not None]

    def _send_load(self, job: LoadJob) -> None:
        job.started = True
        self._out.append(Load(job.load_id, job.server, job.app, job.family, job.variant, job.priority))

    def orphan(self, load_id: int) -> None:
        """The operation waiting for this load is gone: withdraw it, or let it finish unwanted."""
        job = self.jobs.get(load_id)
        if job is None:
            return
        if job.started:
            job.orphan = True
        else:
            del self.jobs[load_id]
            self.loads.finish(load_id)

    def unload(self, server: str, app: str, variant: str) -> None:
        self.state.servers[server].holdings.discard((app, variant))
        self.changes += 1
        self._out.append(Unload(server, app, variant))

    def needed(self, app: str, server: str, variant: str) -> bool:
        """Whether ``app``'s ``variant`` on ``server`` serves, is being upgraded to, or is a backup."""
        rec = self.state.apps.get(app)
        if rec is None:  # removed by a deploy
            return False
        where = Placement(server, variant)
        if rec.route == where or rec.final == where:
            return True
        warm = self.state.warm.get((app, server))
        return warm is not None and variant in (warm.backup.variant, warm.previous)

    # timers -------------------------------------------------------------------------------------
    def wake_at(self, at: float, item: tuple[str, Any] = ("wake", None)) -> None:
        """Have the core stepped at ``at``, handling ``item`` (a kind and its payload) then."""
        heapq.heappush(self._timers, (at, next(self._timer_seq), item[0], item[1]))

    def pop_due(self, now: float) -> tuple[str, Any] | None:
        """The earliest timer due at ``now``, taken off (None: none is due)."""
        if not self._timers or self._timers[0][0] > now + 1e-12:
            return None
        _, _, kind, payload = heapq.heappop(self._timers)
        return kind, payload

    def next_wakeup(self) -> float | None:
        return self._timers[0][0] if self._timers else None


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)
