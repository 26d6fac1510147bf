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

import asyncio
import logging
from typing import Any

from failsoft.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotLoadedError,
    NoRouteError,
    OverloadedError,
    ServerUnavailableError,
)
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.gateway.routes import Route
from failsoft.services import Service, ServiceMode

log = logging.getLogger(__name__)
MOVED = object()  # an attempt's outcome when the request must go to a newer route


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
            outputs = await self._attempt(route, request, f"{request.request_id}#{attempts}", left)
            if outputs is not MOVED:
                return _answer(outputs, route, attempts)
            failed = route
            await routes.wait_route_change(self.app, route, request.deadline - clock.now())

    def _no_route(self, failed: Route | None, waited_s: float) -> NoRouteError:
        if failed is None:
            return NoRouteError(f"app {self.app!r} has no live server (waited {waited_s * 1000:.0f} ms)")
        return NoRouteError(
            f"app {self.app!r}: server {failed.server!r} failed and no new route came in time"
        )

    async def _attempt(self, route: Route, request: Request, call_id: str, left: float) -> Any:
        """The outputs, or MOVED when the request must go to a newer route."""
        try:
            agent = self.context.agents(route.server)
        except ServerUnavailableError as exc:
            log.debug("%s: %s; waiting for a new route", self.app, exc)
            return MOVED
        call = asyncio.ensure_future(
            agent.infer(self.app, route.variant, request.batch, timeout_s=left, request_id=call_id)
        )
        moved = asyncio.ensure_future(self.context.routes.wait_route_change(self.app, route, left))
        try:
            await asyncio.wait({call, moved}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
            answered = call.done()
            if not answered:  # timed out, moved, or the client left: withdraw it
                call.cancel()
                _withdraw(agent, call_id)
        if answered:
            try:
                outputs = call.result()
            except (ServerUnavailableError, ModelNotLoadedError) as exc:
                log.debug("%s on %s: %s; waiting for a new route", self.app, route.server, exc)
                return MOVED
            except (OverloadedError, InvalidRequestError):
                raise  # back-pressure or the client's mistake: not the server's health
            except Exception as exc:
                self.context.outcome(route.server, False, f"{type(exc).__name__}: {exc}")
                raise
            self.context.outcome(route.server, True, "")
            return outputs
        if self.context.routes.route(self.app) != route:
            return MOVED  # the route moved while we waited (a hung server was failed over)
        self.context.outcome(route.server, False, "no answer within the deadline")
        raise DeadlineExceededError(
            f"app {self.app!r}: server {route.server!r} did not answer within the deadline"
        )


def _withdraw(agent: Any, call_id: str) -> None:
    try:
        agent.cancel_nowait(call_id)
    except Exception as exc:  # the server is gone: nothing left to withdraw
        log.debug("cancel %s: %s", call_id, exc)


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
