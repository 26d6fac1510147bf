"""Routing with deadlines and retries: the mechanism that turns a failover into a slow answer, not an error.

The gateway keeps a mirror of the controller's routing table (:class:`RouteMirror`), refreshed by
long-poll the moment a route changes (STYLE 9). The :class:`Router` owns the request's deadline and
its retries (STYLE 10; the routing *policy* is trivially "the app's current route"):

* a request goes to its app's current route, with the time left before its deadline;
* if the server dies under it (the actor is gone), or does not hold the model any more, or the
  route changes while it waits (the server hung and was failed over), the request waits for a newer
  route and tries again, as long as its deadline allows;
* when no route appears before the deadline: :class:`~failsoft.errors.NoRouteError` (503 with
  ``Retry-After``); when a route exists but its server does not answer in time:
  :class:`~failsoft.errors.DeadlineExceededError` (504).

So a client of an app that is recovered within its deadline sees a slower answer, never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from failsoft.errors import (
    DeadlineExceededError,
    FailsoftError,
    ModelNotLoadedError,
    NoRouteError,
    ServerUnavailableError,
)
from failsoft.runtime.cluster import AgentRef, ControllerRef

log = logging.getLogger(__name__)
POLL_S = 10.0


@dataclass(frozen=True, slots=True)
class Route:
    server: str
    variant: str
    kind: str
    degraded: bool
    accuracy: float
    detected_at: float | None
    route_at: float | None

    @classmethod
    def from_entry(cls, entry: dict[str, Any] | None) -> Route | None:
        if entry is None:
            return None
        return cls(
            entry["server"],
            entry["variant"],
            entry["kind"],
            bool(entry["degraded"]),
            float(entry["accuracy"]),
            entry.get("detected_at"),
            entry.get("route_at"),
        )


class RouteMirror:
    """The gateway's copy of the routing table, kept fresh by long-polling the controller."""

    def __init__(self, controller: ControllerRef) -> None:
        self.controller = controller
        self.epoch = ""
        self.version = -1
        self.ready = False
        self.apps: dict[str, dict[str, Any]] = {}
        self.routes: dict[str, Route | None] = {}
        self.connected = False
        self._changed = asyncio.Event()

    def route(self, app: str) -> Route | None:
        return self.routes.get(app)

    def update(self, snap: dict[str, Any]) -> None:
        self.epoch, self.version, self.ready = snap["epoch"], snap["version"], bool(snap.get("ready"))
        self.apps = snap["value"]
        self.routes = {name: Route.from_entry(e["route"]) for name, e in self.apps.items()}
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Long-poll forever; on errors keep the last table and back off (the controller may restart)."""
        backoff = 0.02
        while True:
            try:
                snap = await self.controller.wait_routes(self.epoch, self.version, POLL_S)
                self.connected, backoff = True, 0.02
                if (
                    snap["epoch"] != self.epoch
                    or snap["version"] != self.version
                    or snap.get("ready") != self.ready
                ):
                    self.update(snap)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # controller down or restarting: serve with what we have
                self.connected = False
                log.debug("route long-poll failed: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def wait_change(self, timeout_s: float) -> None:
        """Wait for the next table update (or the timeout)."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))

    async def wait_route_change(self, app: str, route: Route | None, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.route(app) == route:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.wait_change(left)


@dataclass(frozen=True, slots=True)
class Answer:
    outputs: Any
    route: Route
    attempts: int
    answered_at: float


class Router:
    """Sends a request to its app's route, retrying on the next route until the deadline."""

    def __init__(self, mirror: RouteMirror, agents: Callable[[str], AgentRef]) -> None:
        self.mirror = mirror
        self.agents = agents

    async def infer(self, app: str, batch: Any, timeout_s: float) -> Answer:
        deadline = time.monotonic() + timeout_s
        attempts = 0
        while True:
            left = deadline - time.monotonic()
            route = self.mirror.route(app)
            if route is None:
                if left <= 0:
                    raise NoRouteError(f"app {app!r} has no live server (waited {timeout_s * 1000:.0f} ms)")
                await self.mirror.wait_route_change(app, None, left)
                continue
            attempts += 1
            outcome = await self._attempt(app, route, batch, left)
            if outcome is not None:
                return Answer(outcome, route, attempts, time.time())
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoRouteError(
                    f"app {app!r}: server {route.server!r} failed and no new route came in time"
                )
            await self.mirror.wait_route_change(app, route, left)

    async def _attempt(self, app: str, route: Route, batch: Any, left: float) -> Any | None:
        """The answer, or None when the request must move to a newer route."""
        call = asyncio.ensure_future(
            self.agents(route.server).infer(app, route.variant, batch, timeout_s=left)
        )
        moved = asyncio.ensure_future(self.mirror.wait_route_change(app, route, left))
        try:
            done, _ = await asyncio.wait({call, moved}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
        if call in done:
            try:
                return call.result()
            except (ServerUnavailableError, ModelNotLoadedError) as exc:
                log.debug("request for %s on %s failed: %s; waiting for a new route", app, route.server, exc)
                return None
            except DeadlineExceededError:
                raise
            except FailsoftError:
                raise
        call.cancel()
        if moved in done and self.mirror.route(app) != route:
            return None  # the route moved while we waited (a hung server was failed over)
        raise DeadlineExceededError(
            f"app {app!r}: server {route.server!r} did not answer within the deadline"
        )
