"""Stand-ins for the Ray-backed refs, for unit tests of the gateway's asyncio parts on a manual clock.

They fake only the transport: the controller side is the real long-poll host
(:class:`~failsoft.runtime.longpoll.VersionedValue`, :class:`~failsoft.runtime.longpoll.EventLog`)
on the test's clock, and an agent answers after a scripted latency on that clock, or raises a
scripted failsoft error (a dead server, a refused request) that a live cluster produces only by
killing processes or overloading queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
from safetensors.numpy import save

from failsoft.clock import ManualClock
from failsoft.errors import CapacityError, FailsoftError, ModelNotLoadedError, ServerUnavailableError
from failsoft.orchestration import CopyRequest
from failsoft.runtime.gateway.routes import RouteMirror
from failsoft.runtime.longpoll import EventLog, VersionedValue, wait_event

CLASSES = 10


def route_entry(server: str, variant: str = "big", kind: str = "primary", **extra: Any) -> dict[str, Any]:
    return {
        "route": {
            "server": server,
            "variant": variant,
            "kind": kind,
            "degraded": extra.get("degraded", False),
            "accuracy": extra.get("accuracy", 0.9),
            "detected_at": extra.get("detected_at"),
            "route_at": extra.get("route_at"),
        }
    }


class FakeController:
    """The controller's long-poll API over the real long-poll host; ``down`` makes every call fail."""

    def __init__(self, clock: ManualClock, routes: dict[str, Any] | None = None) -> None:
        self.clock = clock
        self.table = VersionedValue(routes or {}, clock=clock)
        self.log = EventLog(clock=clock, epoch=self.table.epoch)
        self.down = False
        self.calls = 0
        self.resumed = asyncio.Event()  # clear: a restarted controller still resuming (not ready)
        self.resumed.set()
        self.agents: dict[str, Any] = {}  # what pin() loads on
        self.ongoing_reports: list[dict[str, int]] = []  # what report_ongoing() was told
        self.allowed: tuple[str, ...] = ()  # where pin() may place a copy (empty: any agent's server)
        self.pins: list[tuple[str, str, str, str]] = []
        self.unpins: list[tuple[str, str, str]] = []
        self.fences: dict[str, float] = {}  # server -> its last failure's stamp, as the controller sends
        self.lost_reports: list[tuple[str, str, str]] = []  # what report_model_lost() was told
        # a report with no ready pinned copy elsewhere: as the core's reload in place (the app
        # unrouted this long, the model loaded back, then routed again), None: recorded only
        self.reload_s: float | None = None
        self._loading: set[asyncio.Task[Any]] = set()

    def set_route(self, app: str, entry: dict[str, Any] | None) -> None:
        pinned = (self.table.value.get(app) or {}).get("pinned", [])
        self.table.publish({**self.table.value, app: {**(entry or {"route": None}), "pinned": pinned}})

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise ServerUnavailableError("controller: unavailable (RayActorError)")

    async def wait_routes(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        """As the controller answers: no table before it is ready ("nothing new" at the timeout)."""
        self._check()
        start = self.clock.now()
        if not await wait_event(self.resumed, timeout_s, self.clock):
            return {"epoch": epoch, "version": version, "value": None, "ready": False}
        left = max(start + timeout_s - self.clock.now(), 0.0)
        return {
            **await self.table.wait_newer(epoch, version, left),
            "ready": True,
            "fences": dict(self.fences),
        }

    async def wait_events(self, epoch: str, seq: int, timeout_s: float) -> dict[str, Any]:
        self._check()
        return await self.log.wait_after(epoch, seq, timeout_s)

    async def stats(self, timeout_s: float = 2.0) -> dict[str, Any]:
        self._check()
        return {"steps": {}}

    async def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        self._check()
        return {"servers": [], "apps": []}

    async def report_ongoing(self, counts: dict[str, int]) -> None:
        self._check()
        self.ongoing_reports.append(dict(counts))

    # mechanism copies: a stand-in for the orchestration core's pin/unpin (tests/orchestration
    # tests the real one); it loads through ``agents`` and publishes ``pinned`` as the core does
    async def pin(self, request: CopyRequest) -> str:
        self._check()
        app, variant, server, owner = request.app, request.variant, request.server, request.owner
        avoid = request.avoid
        if server is None:
            allowed = self.allowed or tuple(self.agents)
            fit = [
                s for s in sorted(allowed) if s not in avoid and not getattr(self.agents[s], "dead", False)
            ]
            if not fit:
                raise CapacityError(f"no server outside {list(avoid)} has room for {app}/{variant}")
            server = fit[0]
        self.pins.append((app, variant, server, owner))
        self._set_pinned(app, server, variant, owner, ready=False)
        task = asyncio.ensure_future(self._load_pinned(app, variant, server, owner))
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)
        return server

    async def _load_pinned(self, app: str, variant: str, server: str, owner: str) -> None:
        try:
            await self.agents[server].load(app, "fam", variant, background=True)
        except FailsoftError:
            self._set_pinned(app, server, None, owner, ready=False)
            return
        self._set_pinned(app, server, variant, owner, ready=True)

    async def unpin(self, app: str, server: str, owner: str) -> None:
        self._check()
        self.unpins.append((app, server, owner))
        gone = [p for p in self.table.value.get(app, {}).get("pinned", []) if p["server"] == server]
        self._set_pinned(app, server, None, owner, ready=False)
        for p in gone:
            await self.agents[server].unload(app, p["variant"])

    def pinned(self, app: str) -> list[dict[str, Any]]:
        return list((self.table.value.get(app) or {}).get("pinned", []))

    def fail_server(self, server: str) -> None:
        """As the core declares ``server`` failed: the pinned copies there are dropped."""
        for app in list(self.table.value):
            if any(p["server"] == server for p in self.pinned(app)):
                self._set_pinned(app, server, None, "", ready=False)

    def declare_failed(self, server: str) -> None:
        """As the controller declares ``server`` failed: a new failure stamp, in a new table version
        (whose routes this fake leaves as they are: a pinned copy's watch does not move)."""
        self.fences[server] = self.clock.now()
        self.table.publish(dict(self.table.value))

    async def report_model_lost(self, app: str, server: str, variant: str) -> None:
        """As ``Orchestrator.model_lost`` (tests/orchestration/test_model_lost.py tests the real
        one): when the app's route is that copy and a ready pinned copy is on another server, that
        copy is promoted; any other report is recorded only."""
        self._check()
        self.lost_reports.append((app, server, variant))
        route = (self.table.value.get(app) or {}).get("route")
        if route is None or (route["server"], route["variant"]) != (server, variant):
            return
        ready = [p for p in self.pinned(app) if p["ready"] and p["server"] != server]
        if ready:
            self.promote(app, ready[0]["server"], ready[0]["variant"])
        elif self.reload_s is not None:
            task = asyncio.ensure_future(self._reload(app, route))
            self._loading.add(task)
            task.add_done_callback(self._loading.discard)

    async def _reload(self, app: str, route: dict[str, Any]) -> None:
        """As the core's reload in place: unrouted while the agent loads the model back, then the
        same placement routed again as a new route (a newer ``route_at``)."""
        self.set_route(app, None)
        await self.clock.sleep(self.reload_s or 0.0)
        await self.agents[route["server"]].load(app, "fam", route["variant"], background=False)
        self.set_route(app, {"route": {**route, "route_at": self.clock.now()}})

    def promote(self, app: str, server: str, variant: str) -> None:
        """As the core's warm switch to a pinned copy: the copy becomes the route (``promoted``)."""
        entry = self.table.value.get(app) or {}
        pinned = [p for p in entry.get("pinned", []) if p["server"] != server]
        route = route_entry(server, variant, "promoted")["route"]
        self.table.publish({**self.table.value, app: {**entry, "route": route, "pinned": pinned}})

    def _set_pinned(self, app: str, server: str, variant: str | None, owner: str, ready: bool) -> None:
        entry = dict(self.table.value.get(app) or {"route": None})
        copies = [p for p in entry.get("pinned", []) if p["server"] != server]
        if variant is not None:
            copies.append({"server": server, "variant": variant, "owner": owner, "ready": ready})
        self.table.publish({**self.table.value, app: {**entry, "pinned": copies}})


class FakeAgent:
    """An agent answering after ``latency_s`` on the clock (``None``: never), or raising ``error``.

    Records each call's request id and time left, and each ``cancel_nowait``.
    """

    def __init__(
        self,
        server: str,
        clock: ManualClock,
        latency_s: float | None = 0.01,
        error: FailsoftError | None = None,
    ) -> None:
        self.server, self.clock = server, clock
        self.latency_s, self.error = latency_s, error
        self.calls: list[dict[str, Any]] = []
        self.cancelled: list[str] = []

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        self.calls.append({"app": app, "variant": variant, "request_id": request_id, "timeout_s": timeout_s})
        if self.error is not None:
            raise self.error
        if self.latency_s is None:
            await asyncio.Future()  # a hung server: never answers
        await self.clock.sleep(self.latency_s)
        logits = np.zeros((len(batch), CLASSES), dtype=np.float32)
        logits[:, 3] = 1.0
        return logits

    def cancel_nowait(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def state(self, app: str, variant: str) -> bytes:
        """A stateful model's state as an agent ships it: safetensors whose metadata counts the
        rows folded in (none: the fake computes nothing)."""
        return save({"h": np.zeros(1, dtype=np.float32)}, metadata={"seq": "0"})

    async def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        """The model loaded back (the controller's reload in place): a lost model is held again."""
        if isinstance(self.error, ModelNotLoadedError):
            self.error = None
        return {}


def sync(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """An async test run in a fresh event loop (no pytest plugin); pytest sees its parameters."""

    def test(**kwargs: Any) -> None:
        asyncio.run(fn(**kwargs))

    test.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    test.__name__, test.__doc__ = fn.__name__, fn.__doc__
    return test


@contextlib.asynccontextmanager
async def mirrored(
    clock: ManualClock, routes: dict[str, Any]
) -> AsyncIterator[tuple[FakeController, RouteMirror]]:
    """A fake controller serving ``routes`` and a route mirror long-polling it (its first table in)."""
    controller = FakeController(clock, routes)
    mirror = RouteMirror(controller, clock)  # type: ignore[arg-type]
    poll = asyncio.ensure_future(mirror.run())
    await clock.run_for(0)
    try:
        yield controller, mirror
    finally:
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
