"""One call to an agent on behalf of a route: the primitive every dispatcher sends its work through.

A dispatcher decides *where* a request goes and what to do when it does not come back (retry on a
newer route, drop it lazily, decode it from parity, promote a backup); :func:`call_on_route` owns
what every one of them must do the same way around the call itself:

* **the deadline**: the agent is given the time left before the request's deadline, and the
  deadline is kept on the context's clock whatever the transport does;
* **the race against a route change**: while the call waits, the app's route is watched
  (:class:`Watch`); once it no longer holds (a hung server was failed over), the call is abandoned
  and the caller told :attr:`CallStatus.MOVED`;
* **withdrawal**: a call abandoned while the server may still hold it (the deadline passed, the
  route moved, or the caller was cancelled because its client left) is withdrawn from the server's
  queue (:meth:`AgentRef.cancel_nowait` with the call's id): no server keeps working for nobody;
* **the fence**: an answer from a server the controller declared failed after the call was sent
  (its failure stamp in the mirror changed meanwhile: :meth:`RouteMirror.fence`) is thrown away
  and the call told :attr:`CallStatus.MOVED`, whatever the watch says (a pinned copy's watch does
  not move when its server fails). So once the gateway has learned that a server failed, no answer
  of that server to a call sent before is returned to a client, however late it comes (a healed
  partition delivering what the server computed meanwhile);
* **health**: :attr:`DispatchContext.outcome` hears, by one rule, how each call the server took on
  ended. An answer is ok; an error raised while serving, or no answer by the deadline on a route
  that did not move, is not. The server's queue refusing or dropping the work (back-pressure:
  :class:`~failsoft.errors.OverloadedError`, :class:`~failsoft.errors.DroppedError`), bad input, a
  route that moved, a server that is gone or no longer holds the model are not outcomes: the first
  is the queue working as designed, the second the client's mistake, the rest the failover's;
* **a model lost on a live server**: a call answered :class:`~failsoft.errors.ModelNotLoadedError`
  is told to the orchestration core (:class:`~failsoft.runtime.gateway.dispatch.interface.LossReports`,
  once per finding), since its server heartbeats on and nothing else would move the route: the
  core promotes the app's pinned copy, switches it to a warm backup, or unroutes it while it
  reloads in place (``Orchestrator.model_lost``); the caller waits for that route, as after a crash.

The result is a small :class:`CallResult`; only bad input and the server's own errors are raised
(after being reported), and :class:`asyncio.CancelledError` passes through once the call is withdrawn.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Any

from failsoft.clock import MonotonicClock
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    DroppedError,
    FailsoftError,
    InvalidRequestError,
    ModelNotLoadedError,
    OverloadedError,
    ServerUnavailableError,
)
from failsoft.runtime import telemetry
from failsoft.runtime.gateway.dispatch.interface import DispatchContext
from failsoft.runtime.gateway.routes import Route, RouteMirror

log = logging.getLogger(__name__)


class CallStatus(enum.Enum):
    """How a call ended, when it did not raise."""

    ANSWERED = "answered"  # the outputs are in
    MOVED = "moved"  # the route moved, the server is gone, or it no longer holds the model
    REFUSED = "refused"  # the server's queue refused it (OverloadedError) or dropped it unrun (DroppedError)
    DEADLINE = "deadline"  # no answer by the deadline on a route that did not move


@dataclass(frozen=True, slots=True)
class CallResult:
    """A call's end: ``outputs`` when answered; otherwise ``error`` says why not (the queue's
    refusal, the move's cause, the deadline's error), ready to be raised by a caller that gives up."""

    status: CallStatus
    outputs: Any = None
    error: FailsoftError | None = None

    def raise_error(self) -> None:
        """Raise :attr:`error` (a dispatcher with no other route to try)."""
        assert self.error is not None, f"a {self.status.value} call has no error"
        raise self.error


@dataclass(frozen=True, slots=True)
class Target:
    """Where a call goes: ``server``'s agent, the model it holds under ``key`` (the app's name, or
    the name of a copy a dispatcher keeps), in ``variant``."""

    server: str
    key: str
    variant: str

    @classmethod
    def route(cls, app: str, route: Route) -> Target:
        """``app``'s model on its route."""
        return cls(route.server, app, route.variant)


@dataclass(frozen=True, slots=True)
class Watch:
    """What a call relies on about ``app``'s route; the call is abandoned once it no longer holds.

    :meth:`route_changes`: any change of ``route`` (FailLite's single path: a newer route is a
    better one). :meth:`leaves_server`: only the route moving to another server (a copy that stays
    valid while the controller re-routes the app on its own server, or unroutes it for a while:
    HAMS's primary, a Jellyfish worker). :meth:`serves_on`: ``app`` no longer served on ``server``
    at all, by its route or a replica, nor finishing there after a scale-in (a call on one of
    several replicas). :meth:`server_fails`: only ``server`` failing, as the gateway learns it (its
    connection ended, or the controller's failure stamp of it changed from ``fence``): a call on a
    warm backup the gateway chose before the controller routed the app (the backup serves its
    calls whatever the controller's route becomes, until it is unloaded: then the call moves).
    """

    app: str
    route: Route | None = None
    server: str | None = None
    any_active: bool = False
    until_failed: bool = False
    fence: float | None = None

    @classmethod
    def route_changes(cls, app: str, route: Route | None) -> Watch:
        return cls(app, route=route)

    @classmethod
    def leaves_server(cls, app: str, server: str) -> Watch:
        return cls(app, server=server)

    @classmethod
    def serves_on(cls, app: str, server: str) -> Watch:
        return cls(app, server=server, any_active=True)

    @classmethod
    def server_fails(cls, app: str, server: str, fence: float | None) -> Watch:
        return cls(app, server=server, until_failed=True, fence=fence)

    @property
    def any_change(self) -> bool:
        """Whether it may stop holding at any change of the mirror (not only ``app``'s route's)."""
        return self.any_active or self.until_failed

    def moved(self, now: Route | None) -> bool:
        if self.server is not None:
            return now is not None and now.server != self.server
        return now != self.route

    def moved_in(self, routes: RouteMirror) -> bool:
        """Whether the watch no longer holds in the table ``routes`` mirrors."""
        if self.until_failed:
            assert self.server is not None
            return routes.lost(self.server) or routes.fence(self.server) != self.fence
        if self.any_active:
            assert self.server is not None
            if routes.finishing(self.app, self.server):
                return False
            return all(r.server != self.server for r in routes.active(self.app))
        return self.moved(routes.route(self.app))


async def call_on_route(
    context: DispatchContext,
    target: Target,
    batch: Any,
    call_id: str,
    deadline: float,
    watch: Watch | None = None,
) -> CallResult:
    """Call ``target`` with ``batch`` until ``deadline`` (on ``context.clock``), racing ``watch``.

    ``call_id`` names the call at the agent (what a withdrawal names); a dispatcher derives one per
    call from its request's id. Raises bad input (:class:`~failsoft.errors.InvalidRequestError`,
    :class:`~failsoft.errors.ConfigError`) unreported, any other error the server raised while
    serving after reporting it, and :class:`asyncio.CancelledError` after withdrawing the call.

    With tracing on, the call is an ``agent.call`` span whose context travels in the call's ``meta``
    (a plain dict of strings, whatever the transport: :mod:`failsoft.runtime.telemetry`).
    """
    with telemetry.call_span(target.server, target.key, target.variant) as meta:
        return await _call(context, target, batch, call_id, deadline, watch, meta)


async def _call(
    context: DispatchContext,
    target: Target,
    batch: Any,
    call_id: str,
    deadline: float,
    watch: Watch | None,
    meta: dict[str, str],
) -> CallResult:
    clock = context.clock
    left = deadline - clock.now()
    if left <= 0:  # nothing sent: nothing to withdraw or report
        return CallResult(CallStatus.DEADLINE, error=_late(target))
    try:
        agent = context.agents(target.server)
    except ServerUnavailableError as exc:  # being replaced: wait for a newer route
        return CallResult(CallStatus.MOVED, error=exc)
    fence = context.routes.fence(target.server)
    call = _send(agent, target, batch, left, call_id, meta)
    try:
        await _race(context, call, watch, deadline)
    finally:
        ended = call.done()
        if not ended:  # the deadline, a move, or the caller's cancellation came first
            call.cancel()
            withdraw(agent, call_id)
    if ended:
        result = _settled(context, target, call, watch, fence)
        if result.status is CallStatus.DEADLINE:  # the transport gave up: the queue may still hold it
            withdraw(agent, call_id)
        return result
    if watch is not None and watch.moved_in(context.routes):
        log.debug("%s: the route of %s moved off %s during the call", call_id, watch.app, target.server)
        what = f"server {target.server!r} failed" if watch.until_failed else "the controller moved its route"
        moved = ServerUnavailableError(f"app {watch.app!r}: {what} during the call to {target.server!r}")
        return CallResult(CallStatus.MOVED, error=moved)
    context.outcome(target.server, False, "no answer within the deadline")
    return CallResult(CallStatus.DEADLINE, error=_late(target))


def _settled(
    context: DispatchContext,
    target: Target,
    call: asyncio.Future[Any],
    watch: Watch | None,
    fence: float | None,
) -> CallResult:
    """A call that ended on its own: its outputs (unless fenced off), or its error classified by
    the one rule."""
    try:
        outputs = call.result()
    except ServerUnavailableError as exc:
        log.debug("%s on %s: %s; the call moves", target.key, target.server, exc)
        return CallResult(CallStatus.MOVED, error=exc)
    except ModelNotLoadedError as exc:  # the server lives: nothing else would move the route
        log.info("%s on %s: %s; told to the controller, the call moves", target.key, target.server, exc)
        context.losses.report(context.copies, target.key, target.server, target.variant)
        return CallResult(CallStatus.MOVED, error=exc)
    except (OverloadedError, DroppedError) as exc:  # back-pressure: the queue's verdict
        return CallResult(CallStatus.REFUSED, error=exc)
    except (InvalidRequestError, ConfigError):  # the client's mistake: not the server's health
        raise
    except DeadlineExceededError as exc:  # the transport's own timeout: no answer in time
        if watch is not None and watch.moved_in(context.routes):
            return CallResult(CallStatus.MOVED, error=exc)
        context.outcome(target.server, False, f"{type(exc).__name__}: {exc}")
        return CallResult(CallStatus.DEADLINE, error=exc)
    except Exception as exc:  # the server failed while serving
        context.outcome(target.server, False, f"{type(exc).__name__}: {exc}")
        raise
    if context.routes.fence(target.server) != fence:  # declared failed since the call was sent
        log.info("%s: %s answered after it was declared failed: fenced off", target.key, target.server)
        fenced = ServerUnavailableError(
            f"server {target.server!r} was declared failed during the call: its answer is fenced off"
        )
        return CallResult(CallStatus.MOVED, error=fenced)
    context.outcome(target.server, True, "")
    return CallResult(CallStatus.ANSWERED, outputs=outputs)


def _send(
    agent: Any, target: Target, batch: Any, left: float, call_id: str, meta: dict[str, str]
) -> asyncio.Future[Any]:
    """The call under way: sent at once over an open data-plane connection (the reply's future,
    no task), else a task that awaits ``agent.infer`` (it connects first, or calls over Ray)."""
    extra: dict[str, Any] = {"meta": meta} if meta else {}  # nothing to carry when tracing is off
    start = getattr(agent, "infer_started", None)
    if start is not None:
        try:
            sent = start(target.key, target.variant, batch, left, call_id, **extra)
        except FailsoftError as exc:  # the connection is lost: settled as a call that failed
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        if sent is not None:
            return sent
    return asyncio.ensure_future(
        agent.infer(target.key, target.variant, batch, timeout_s=left, request_id=call_id, **extra)
    )


async def _race(
    context: DispatchContext, call: asyncio.Future[Any], watch: Watch | None, deadline: float
) -> None:
    """Return once ``call`` is done, ``watch`` no longer holds, or ``deadline`` passed.

    On the runtime's clock (the event loop's own, ``time.monotonic``) the call is raced against the
    mirror's next update and a timer, with no task of its own: per request, tasks were a large
    share of the gateway's work on a small model. Any other clock (a test's) times the race with
    its own sleeps, in a watcher task."""
    clock, routes = context.clock, context.routes
    if type(clock) is not MonotonicClock:
        watcher = asyncio.ensure_future(_until_moved(context, watch, deadline))
        try:
            await asyncio.wait({call, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        return
    while not call.done():
        left = deadline - clock.now()
        if left <= 0 or (watch is not None and watch.moved_in(routes)):
            return
        if watch is None:
            await asyncio.wait((call,), timeout=left)
        else:
            update = routes.next_update()
            await asyncio.wait((call, update), timeout=left, return_when=asyncio.FIRST_COMPLETED)


async def _until_moved(context: DispatchContext, watch: Watch | None, deadline: float) -> bool:
    """True once ``watch`` no longer holds; False at ``deadline`` (on the context's clock)."""
    clock, routes = context.clock, context.routes
    while True:
        left = deadline - clock.now()
        if watch is None:
            if left > 0:
                await clock.sleep(left)
            return False
        if watch.moved_in(routes):
            return True
        if left <= 0:
            return False
        if watch.any_change:
            await routes.wait_change(left)
        else:
            await routes.wait_route_change(watch.app, routes.route(watch.app), left)


def withdraw(agent: Any, call_id: str) -> None:
    """Withdraw ``call_id`` from ``agent``'s queue, fire and forget (a gone server holds nothing)."""
    try:
        agent.cancel_nowait(call_id)
    except Exception as exc:
        log.debug("cancel %s: %s", call_id, exc)


def _late(target: Target) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"app {target.key!r}: server {target.server!r} did not answer within the deadline"
    )
