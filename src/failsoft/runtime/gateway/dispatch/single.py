"""The ``single`` dispatcher: FailLite's request path, one member app on its current route.

A failover becomes a slower answer, not an error:

* a request goes to its app's current route, with the time left before its deadline;
* if the server dies under it (its agent is gone), does not hold the model any more, or the route
  changes while it waits (a hung server was failed over), the request moves to the newer route and
  is tried again, as long as its deadline allows; the call it leaves behind is withdrawn from that
  server's queue (``cancel_nowait``), as is a call still running at the deadline;
* when no route appears before the deadline: :class:`~failsoft.errors.NoRouteError` (503); when a
  route exists but its server does not answer in time: :class:`~failsoft.errors.DeadlineExceededError`
  (504); an overloaded queue's :class:`~failsoft.errors.OverloadedError` and every other error pass
  through to the client unchanged (there is no other route to try).

Which route serves the app is the controller's decision (its failover policy), mirrored here; this
module owns only the mechanism: deadlines, moves, retries and cancellation, all on the injected clock.
"""

from __future__ import annotations

import logging
from typing import Any

from failsoft.errors import NoRouteError
from failsoft.runtime.gateway.dispatch.calls import CallStatus, Target, Watch, call_on_route
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.gateway.routes import Route
from failsoft.services import Service, ServiceMode

log = logging.getLogger(__name__)


class SingleDispatcher(Dispatcher):
    """One member app, served on its current route; retried on a newer route until the deadline."""

    mode = ServiceMode.SINGLE

    def __init__(self, service: Service, context: DispatchContext) -> None:
        super().__init__(service, context)
        (self.app,) = service.members

    def ready(self) -> bool:
        return self.context.routes.route(self.app) is not None

    def describe(self) -> dict[str, Any]:
        route = self.context.routes.route(self.app)
        return {
            "version": None if route is None else route.variant,
            "state": "READY" if route is not None else "UNAVAILABLE",
            "reason": "" if route is not None else "no live server holds it",
            "server": None if route is None else route.server,
            "kind": None if route is None else route.kind,
            "degraded": bool(route and route.degraded),
        }

    async def dispatch(self, request: Request) -> Answer:
        clock, routes = self.context.clock, self.context.routes
        started = clock.now()
        attempts = 0
        failed: Route | None = None  # the last route an attempt left
        while True:
            left = request.deadline - clock.now()
            route = routes.route(self.app)
            if left <= 0:
                raise self._no_route(failed, clock.now() - started)
            if route is None:
                await routes.wait_route_change(self.app, None, left)
                continue
            attempts += 1
            result = await call_on_route(
                self.context,
                Target.route(self.app, route),
                request.batch,
                f"{request.request_id}#{attempts}",
                request.deadline,
                Watch.route_changes(self.app, route),
            )
            if result.status is CallStatus.ANSWERED:
                return _answer(result.outputs, route, attempts)
            if result.status is not CallStatus.MOVED:
                result.raise_error()  # refused by its queue, or late: there is no other route to try
            log.debug("%s: %s; waiting for a new route", self.app, result.error)
            self.moved(route)
            failed = route
            await routes.wait_route_change(self.app, route, request.deadline - clock.now())

    def moved(self, route: Route) -> None:
        """A call found ``route`` dead (its server gone or not holding the model, or the route moved
        under it); the request now waits for a newer one. Nothing by default (a coded service's
        members remember it)."""
        return None

    def _no_route(self, failed: Route | None, waited_s: float) -> NoRouteError:
        if failed is None:
            return NoRouteError(f"app {self.app!r} has no live server (waited {waited_s * 1000:.0f} ms)")
        return NoRouteError(
            f"app {self.app!r}: server {failed.server!r} failed and no new route came in time"
        )


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
