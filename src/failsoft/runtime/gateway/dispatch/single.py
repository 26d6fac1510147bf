"""The ``single`` dispatcher: FailLite's request path, one member app on its active routes.

A failover becomes a slower answer, not an error:

* a request goes to one of its app's active routes (its route, or one of its replicas: the power of
  two choices on the requests this gateway has in flight on each, as Ray Serve's router), with the
  time left before its deadline;
* if the server dies under it (its agent is gone), does not hold the model any more, or the route
  changes while it waits (a hung server was failed over), the request moves: at once to another
  active route when the app has one (a crashed replica's share goes to the others), else to the
  newer route once the controller publishes it, as long as its deadline allows; the call it leaves
  behind is withdrawn from that server's queue (``cancel_nowait``), as is a call still running at
  the deadline;
* a server whose data-plane connection ended (its process died) is not called until the
  controller's table speaks about it; a request whose app's route is there goes at once to the
  app's other active routes, else to its most accurate loaded warm backup on a live server, as the
  controller's warm switch will (:meth:`~failsoft.runtime.gateway.routes.RouteMirror.stand_in`),
  without waiting a route's trip over Ray; the controller's route, once it comes, wins for later
  requests. A stateful node's calls (HAMS: its promotion is the core's) and a coded service's
  members (ParM decodes meanwhile) do not take this shortcut (``shortcut=False``);
* a queue that refuses the request (:class:`~failsoft.errors.OverloadedError`) sends it to another
  active route when there is one;
* when no route appears before the deadline: :class:`~failsoft.errors.NoRouteError` (503); when a
  route exists but its server does not answer in time: :class:`~failsoft.errors.DeadlineExceededError`
  (504); a refusal from every active route and every other error pass through to the client
  unchanged.

Which routes serve the app is the controller's decision (its failover policy, its replicas),
mirrored here; this module owns only the mechanism: the choice among them, deadlines, moves, retries
and cancellation, all on the injected clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from failsoft.errors import NoRouteError
from failsoft.policies.replica_routing import power_of_two
from failsoft.runtime.gateway.dispatch.calls import CallResult, CallStatus, Target, Watch, call_on_route
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Move, Request
from failsoft.runtime.gateway.routes import BACKUP_KIND, REPLICA_KIND, Route
from failsoft.services import Service, ServiceMode

log = logging.getLogger(__name__)


class SingleDispatcher(Dispatcher):
    """One member app, served on its active routes; retried on another until the deadline."""

    mode = ServiceMode.SINGLE

    def __init__(self, service: Service, context: DispatchContext, shortcut: bool = True) -> None:
        super().__init__(service, context)
        (self.app,) = service.members
        self.shortcut = shortcut  # off a lost server before the controller's route (module docstring)
        self.in_flight: dict[str, int] = {}  # server -> this app's calls under way there
        self._ongoing = 0  # requests being served (waiting for a route included)
        self._rng = random.Random(f"p2c:{self.app}")  # fixed seed: the same choices in every run

    def ready(self) -> bool:
        return self.context.routes.route(self.app) is not None

    def ongoing(self) -> Mapping[str, int]:
        return {self.app: self._ongoing}

    def describe(self) -> dict[str, Any]:
        route = self.context.routes.route(self.app)
        return {
            "version": None if route is None else route.variant,
            "state": "READY" if route is not None else "UNAVAILABLE",
            "reason": "" if route is not None else "no live server holds it",
            "server": None if route is None else route.server,
            "kind": None if route is None else route.kind,
            "degraded": bool(route and route.degraded),
            "replicas": len(self.context.routes.active(self.app)),
        }

    async def dispatch(self, request: Request) -> Answer:
        self._ongoing += 1
        try:
            return await self._dispatch(request)
        finally:
            self._ongoing -= 1

    async def _dispatch(self, request: Request) -> Answer:
        clock, routes = self.context.clock, self.context.routes
        started = clock.now()
        attempts = 0
        failed: Route | None = None  # the last route an attempt left
        left_behind: set[Route] = set()  # routes this request found dead or full
        dead: _Dead | None = None  # the first dead server this request met
        while True:
            left = request.deadline - clock.now()
            if left <= 0:
                raise self._no_route(failed, clock.now() - started)
            targets = self._targets(left_behind)
            if dead is None and self.shortcut:
                dead = self._skipped(started)
            if not targets:  # none yet, or every one failed this request: wait for a newer table
                await routes.wait_change(left)
                continue
            route = self._choose(targets)
            attempts += 1
            sent = (clock.now(), routes.updated_at)
            result = await self._call(route, request, attempts)
            if result.status is CallStatus.ANSWERED:
                if dead is not None:
                    self.context.moved(dead.move(self.app, request.request_id, route, sent, clock.now()))
                return _answer(result.outputs, route, attempts)
            if result.status is CallStatus.DEADLINE:
                result.raise_error()
            left_behind.add(route)
            if result.status is CallStatus.REFUSED:
                if all(r in left_behind for r in routes.active(self.app)):
                    result.raise_error()  # every active route's queue is full: the client backs off
                continue
            log.debug("%s: %s; trying another route", self.app, result.error)
            if dead is None:
                dead = _Dead(route.server, started, routes.lost_at(route.server), clock.now())
            self.moved(route)
            failed = route

    def _targets(self, left_behind: set[Route]) -> list[Route]:
        """The routes this request may take now: the app's active routes it has not left, less
        those on lost servers; none of them, its warm backup when its route's server is lost."""
        routes = self.context.routes
        active = routes.active(self.app)
        if not self.shortcut:
            return [r for r in active if r not in left_behind]
        targets = [r for r in active if r not in left_behind and not routes.lost(r.server)]
        if not targets:
            backup = routes.stand_in(self.app, left_behind)
            if backup is not None:
                targets.append(backup)
        return targets

    def _skipped(self, started: float) -> _Dead | None:
        """The app's route's server, when it is lost (the request is not sent there)."""
        routes = self.context.routes
        route = routes.route(self.app)
        lost_at = None if route is None else routes.lost_at(route.server)
        return None if route is None or lost_at is None else _Dead(route.server, started, lost_at, None)

    def _choose(self, targets: list[Route]) -> Route:
        if len(targets) == 1:
            return targets[0]
        server = power_of_two([r.server for r in targets], self.in_flight, self._rng)
        return next(r for r in targets if r.server == server)

    async def _call(self, route: Route, request: Request, attempts: int) -> CallResult:
        """One attempt on ``route``, counted in flight there while it runs."""
        routes = self.context.routes
        if route.kind == BACKUP_KIND:
            watch = Watch.server_fails(self.app, route.server, routes.fence(route.server))
        elif route == routes.route(self.app):
            watch = Watch.route_changes(self.app, route)
        else:
            watch = Watch.serves_on(self.app, route.server)
        self.in_flight[route.server] = self.in_flight.get(route.server, 0) + 1
        try:
            return await call_on_route(
                self.context,
                Target.route(self.app, route),
                request.batch,
                f"{request.request_id}#{attempts}",
                request.deadline,
                watch,
            )
        finally:
            self.in_flight[route.server] -= 1

    def moved(self, route: Route) -> None:
        """A call found ``route`` dead (its server gone or not holding the model, or the route moved
        under it); the request now goes to another active route or waits for a newer one. Nothing
        by default (a coded service's members remember it)."""
        return None

    def _no_route(self, failed: Route | None, waited_s: float) -> NoRouteError:
        if failed is None:
            return NoRouteError(f"app {self.app!r} has no live server (waited {waited_s * 1000:.0f} ms)")
        return NoRouteError(
            f"app {self.app!r}: server {failed.server!r} failed and no new route came in time"
        )


@dataclass(frozen=True, slots=True)
class _Dead:
    """The first dead server a request met: where, when the request came, when the server's
    connection ended as the gateway saw it, and when the request's call there failed (None: not
    sent there, it was known lost)."""

    server: str
    started_at: float
    lost_at: float | None
    failed_at: float | None

    def move(
        self, app: str, request_id: str, route: Route, sent: tuple[float, float | None], at: float
    ) -> Move:
        """The move's record, answered ``at`` on ``route``; ``sent``: when that call was sent, and
        when the route table it was chosen from came in."""
        via = {BACKUP_KIND: "backup", REPLICA_KIND: "replica"}.get(route.kind, "route")
        ours = via == "route"
        return Move(
            app, request_id, self.server, route.server, via, self.started_at, self.lost_at, self.failed_at,
            sent[1] if ours else None, route.route_at if ours else None, sent[0], at,
        )  # fmt: skip


def _answer(outputs: Any, route: Route, attempts: int) -> Answer:
    return Answer(
        outputs=outputs,
        server=route.server,
        variant=route.variant,
        degraded=route.degraded,
        accuracy=route.accuracy,
        kind=route.kind,
        attempts=attempts,
        detected_at=route.detected_at,
        route_at=route.route_at,
    )
