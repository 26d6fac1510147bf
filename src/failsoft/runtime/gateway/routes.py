"""The gateway's mirror of the controller's routing table, kept fresh by push and long-poll.

The controller publishes the table (app -> server and variant) under an epoch and a version; the
mirror asks "wake me when you have something newer than what I hold" and updates the moment a route
changes. The controller also pushes each table the moment it publishes it (ZeroMQ PUB/SUB,
:mod:`failsoft.runtime.routepush`, to the endpoint its long-poll answers name): that is the fast
path, the long-poll the reliable one. Whichever brings a table first, the mirror takes it only when
it is newer (:meth:`RouteMirror.offer`): within one controller's epoch a greater version, and a new
epoch (a restarted controller) only from the long-poll, so a duplicate, a table overtaken by a
newer one or a dead controller's push still queued changes nothing.

An app with replicas has several active routes: its route, then its loaded replicas
(:meth:`RouteMirror.active`), among which the ``single`` dispatcher chooses per request.
Dispatchers read member routes here and wait on :meth:`RouteMirror.wait_route_change` when a route
is missing or moved. Every wait runs on the injected clock; the controller being away is
reported by the :class:`~failsoft.runtime.gateway.link.ControllerLink` and the last table keeps
serving meanwhile; so it does while a restarted controller resumes (it answers "nothing new" until
it is ready, however long its store takes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from failsoft.clock import AsyncClock
from failsoft.runtime.gateway.link import ControllerLink
from failsoft.runtime.longpoll import wait_event
from failsoft.runtime.routepush import RouteSubscriber

if TYPE_CHECKING:
    from failsoft.runtime.cluster import ControllerRef

POLL_S = 10.0
REPLICA_KIND = "replica"  # the kind of an answer a replica gave (besides the route's own kinds)
BACKUP_KIND = "backup"  # of an answer a warm backup gave before the controller routed the app there
# A server whose connection ended is avoided this long at most without the controller's word (a
# controller that is away, or one that judged the report stale): then calls try it again.
LOST_HOLD_S = 5.0
STREAM = "route long-poll"
PUSH, LONG_POLL = "push", "long-poll"  # the two paths a table comes by


@dataclass(frozen=True, slots=True)
class Route:
    """Where an app is served now; ``detected_at`` and ``route_at`` (wall clock) mark a failover route."""

    server: str
    variant: str
    kind: str
    degraded: bool
    accuracy: float
    detected_at: float | None
    route_at: float | None

    @classmethod
    def replica(cls, entry: dict[str, Any]) -> Route:
        """One of an app's replicas (``replicas.serving`` in the table): its home variant, no failover."""
        accuracy = float(entry["accuracy"])
        return cls(entry["server"], entry["variant"], REPLICA_KIND, False, accuracy, None, None)

    @classmethod
    def backup(cls, entry: dict[str, Any]) -> Route:
        """One of an app's loaded warm backups (``warm`` in the table), as a route to move to."""
        return cls(
            entry["server"], entry["variant"], BACKUP_KIND, bool(entry["degraded"]),
            float(entry["accuracy"]), None, None,
        )  # fmt: skip

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


@dataclass(frozen=True, slots=True)
class PinnedCopy:
    """A mechanism's copy of an app (``Controller.pin``): where, which variant, whose, and whether
    its load has finished (``ready``: it serves)."""

    server: str
    variant: str
    owner: str | None
    ready: bool


class RouteMirror:
    """The routing table as last heard from the controller; waits for changes on the injected clock."""

    def __init__(
        self, controller: ControllerRef, clock: AsyncClock, link: ControllerLink | None = None
    ) -> None:
        self.controller = controller
        self.clock = clock
        self.link = link or ControllerLink()
        self.epoch = ""
        self.version = -1
        self.ready = False
        self.routes: dict[str, Route | None] = {}
        self.pinned: dict[str, tuple[PinnedCopy, ...]] = {}
        self.fences: dict[str, float] = {}  # server -> the controller's stamp of its last failure

        self.replicas: dict[str, tuple[Route, ...]] = {}  # each app's loaded replicas besides its route
        self.autoscaled: frozenset[str] = frozenset()  # apps whose replicas follow their load
        self.draining: dict[str, frozenset[str]] = {}  # servers of replicas dropped, still finishing
        self.backups: dict[str, tuple[Route, ...]] = {}  # each app's loaded warm backups (live servers)
        self.updated_at: float | None = None  # on the clock: when the last table came in
        self.taken = {PUSH: 0, LONG_POLL: 0}  # tables taken, by the path that brought them first
        self._push: RouteSubscriber | None = None
        # server -> (when its connection ended, on the clock; its failure stamp when it was made)
        self._lost: dict[str, tuple[float, float | None]] = {}
        self._made: dict[str, float | None] = {}  # server -> its failure stamp when its connection was made
        self._made_early: set[str] = set()  # connections made before the first table: its stamps count
        self._changed = asyncio.Event()
        self._update: asyncio.Future[None] | None = None  # done at the next update (next_update)

    def route(self, app: str) -> Route | None:
        return self.routes.get(app)

    def fence(self, server: str) -> float | None:
        """The stamp of ``server``'s last failure as the controller declared it (None: never
        failed). A call whose server's stamp changed while it ran was sent before the gateway
        learned of a failure: its answer is fenced off (:func:`~.dispatch.calls.call_on_route`)."""
        return self.fences.get(server)

    def finishing(self, app: str, server: str) -> bool:
        """Whether ``app`` has a replica on ``server`` that was dropped (scaled in) and finishes
        the requests it holds: nothing new goes there, what is there is not moved."""
        return server in self.draining.get(app, ())

    def active(self, app: str) -> tuple[Route, ...]:
        """Every route serving ``app`` now: its route (first), then its loaded replicas."""
        route = self.routes.get(app)
        if route is None:
            return self.replicas.get(app, ())
        return (route, *(r for r in self.replicas.get(app, ()) if r.server != route.server))

    def offer(self, snap: dict[str, Any], via: str = PUSH) -> bool:
        """A table from either path (``via``): taken (True) when it is newer than the one held.

        Newer: the same epoch and a greater version (or the same version turned ready); a new epoch
        only by long-poll, which asks the live controller (a push still queued from a controller
        that died must not undo its successor's table). A table with no value (a resuming
        controller's "nothing yet") is never taken."""
        if snap.get("value") is None:
            return False
        epoch, version, ready = snap["epoch"], int(snap["version"]), bool(snap.get("ready"))
        if epoch == self.epoch:
            if (version, ready) <= (self.version, self.ready):
                return False
        elif via != LONG_POLL:
            return False
        self.update(snap)
        self.taken[via] = self.taken.get(via, 0) + 1
        return True

    def update(self, snap: dict[str, Any]) -> None:
        """Take a snapshot ``{"epoch", "version", "ready", "value": {app: {"route": entry}},
        "fences": {server: stamp}, "push": endpoint}`` (whatever the versions: :meth:`offer` checks)."""
        self.epoch, self.version, self.ready = snap["epoch"], snap["version"], bool(snap.get("ready"))
        self.fences = {str(k): float(v) for k, v in (snap.get("fences") or {}).items()}
        self.routes = {name: Route.from_entry(e["route"]) for name, e in snap["value"].items()}
        self.pinned = {
            name: tuple(
                PinnedCopy(p["server"], p["variant"], p.get("owner"), bool(p["ready"]))
                for p in e.get("pinned", ())
            )
            for name, e in snap["value"].items()
        }
        replicas = {name: e.get("replicas") or {} for name, e in snap["value"].items()}
        self.replicas = {
            name: tuple(Route.replica(r) for r in rep.get("serving", ())) for name, rep in replicas.items()
        }
        self.autoscaled = frozenset(name for name, rep in replicas.items() if rep.get("autoscaling"))
        self.draining = {name: frozenset(rep.get("draining", ())) for name, rep in replicas.items()}
        self.backups = {
            name: tuple(Route.backup(w) for w in e.get("warm") or ()) for name, e in snap["value"].items()
        }
        for server in self._made_early:
            self._made[server] = self.fences.get(server)
        self._made_early.clear()
        self.updated_at = self.clock.now()
        self._subscribe(snap.get("push"))
        self._wake()

    def _subscribe(self, endpoint: str | None) -> None:
        """Take the controller's pushed tables from ``endpoint`` (a new one: a restarted controller)."""
        if self._push is not None and self._push.endpoint == endpoint:
            return
        self.close()
        if endpoint:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # a table given outside any loop (a test): nothing to read with
                return
            self._push = RouteSubscriber(endpoint, self._offered)

    def _offered(self, snap: dict[str, Any]) -> None:
        self.offer(snap, PUSH)

    def close(self) -> None:
        """Stop taking pushed tables (the long-poll's task is its caller's to cancel)."""
        if self._push is not None:
            self._push.close()
            self._push = None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        update, self._update = self._update, None
        if update is not None and not update.done():
            update.set_result(None)

    # the connection's end: the next route before the controller's --------------------------------
    def connection_lost(self, server: str) -> None:
        """The gateway's data-plane connection to ``server`` ended (its process died): no call goes
        there until the controller's table speaks about it (module docstring). Wakes the waiters."""
        self._made_early.discard(server)
        self._lost[server] = (self.clock.now(), self._made.pop(server, self.fence(server)))
        self._wake()

    def connection_made(self, server: str) -> None:
        """A connection to ``server`` is up (at start, or to a restarted agent): not lost."""
        self._made[server] = self.fence(server)
        if self.updated_at is None:
            self._made_early.add(server)
        if self._lost.pop(server, None) is not None:
            self._wake()

    def lost_at(self, server: str) -> float | None:
        """When ``server``'s connection ended (on the clock), while it counts as lost; else None.

        It stops counting once the controller's failure stamp of it is not the one it had when
        the connection was made (it was declared failed since, maybe before the gateway saw the
        end: the table no longer routes there), or :data:`LOST_HOLD_S` after the end."""
        mark = self._lost.get(server)
        if mark is None:
            return None
        at, fence = mark
        if self.fence(server) != fence or self.clock.now() - at > LOST_HOLD_S:
            del self._lost[server]
            return None
        return at

    def lost(self, server: str) -> bool:
        return bool(self._lost) and self.lost_at(server) is not None

    def stand_in(self, app: str, avoid: Collection[Route] = ()) -> Route | None:
        """Where a call of ``app`` goes when its route's server is lost and the controller has not
        moved it yet: its most accurate loaded warm backup on a server that is not lost (ties: the
        server's name), as the controller's warm switch would choose; None when the route is not on
        a lost server or no backup qualifies. ``avoid``: backups this request already left."""
        route = self.routes.get(app)
        if route is None or not self.lost(route.server):
            return None
        options = [b for b in self.backups.get(app, ()) if b not in avoid and not self.lost(b.server)]
        return max(options, key=lambda b: (b.accuracy, b.server), default=None)

    async def run(self) -> None:
        """Long-poll forever (and take pushed tables once a table names where they are pushed);
        while the controller is away keep the last table (it may restart)."""
        try:
            await self._poll()
        finally:
            self.close()

    async def _poll(self) -> None:
        while True:
            snap = await self.link.retry(
                STREAM, lambda: self.controller.wait_routes(self.epoch, self.version, POLL_S), self.clock
            )
            # no value: the controller is not ready yet (a restarted one resuming): keep our table;
            # no newer than ours: the push brought it first
            self.offer(snap, LONG_POLL)

    def pinned_copy(self, app: str, server: str) -> PinnedCopy | None:
        """``app``'s pinned copy on ``server`` as last published (None: there is none)."""
        return next((p for p in self.pinned.get(app, ()) if p.server == server), None)

    async def wait_pinned(self, app: str, server: str, variant: str, timeout_s: float) -> bool:
        """Wait until ``app``'s pinned copy of ``variant`` on ``server`` is published ready: True;
        False when it is gone once seen (its load failed, its server failed, it was replaced), or
        when ``timeout_s`` passed first. The pin's own publish may arrive after the pin answered:
        a copy not seen yet is waited for."""
        deadline = self.clock.now() + timeout_s
        seen = False
        while True:
            copy = self.pinned_copy(app, server)
            if copy is not None and copy.variant == variant:
                if copy.ready:
                    return True
                seen = True
            elif seen:
                return False
            left = deadline - self.clock.now()
            if left <= 0:
                return False
            await self.wait_change(left)

    def next_update(self) -> asyncio.Future[None]:
        """A future done at the next table update, shared by every caller until then: what a call
        in flight races its answer against (no task or timer per call). Never cancel it."""
        loop = asyncio.get_running_loop()
        if self._update is None or self._update.done() or self._update.get_loop() is not loop:
            self._update = loop.create_future()
        return self._update

    async def wait_change(self, timeout_s: float) -> bool:
        """Wait for the next table update; False when ``timeout_s`` passed first."""
        return await wait_event(self._changed, timeout_s, self.clock)

    async def wait_route_change(self, app: str, route: Route | None, timeout_s: float) -> bool:
        """Wait until ``app``'s route is no longer ``route``; False when ``timeout_s`` passed first."""
        deadline = self.clock.now() + timeout_s
        while self.route(app) == route:
            left = deadline - self.clock.now()
            if left <= 0:
                return False
            await self.wait_change(left)
        return True
