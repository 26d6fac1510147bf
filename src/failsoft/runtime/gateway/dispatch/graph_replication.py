"""HAMS's stateful half at run time: each stateful graph node on a primary and a backup copy.

The ``graph`` dispatcher (:mod:`.graph`) calls a stateful node through :class:`Replication`, which
carries out what the replication protocol (:mod:`failsoft.policies.replication`, ``nspb``) commands,
the protocol itself staying pure (events in, commands out):

* **The copies.** A stateful node's *primary* is the controller's copy of its app (the app's route).
  Its *backup* is a copy the orchestration core places (``PlaceBackup``): the dispatcher asks for a
  pinned copy of the app away from the primary's server (``copies.pin``, owner ``graph:<service>``),
  the core picks the server with its capacity view, loads it at the warm-backup priority and
  publishes it; once the routing table shows it ready, ``BackupPlaced``. The dispatcher never loads
  or unloads a model itself.
* **Non-stop shipping.** A node's output is forwarded downstream the moment it is computed
  (``OutputComputed`` -> ``ReleaseOutput``); the state it left is shipped *meanwhile*
  (``SendState``: :meth:`AgentRef.state` on the primary, one transfer in flight, the newest state
  next) and applied on the backup (``ApplyState``: :meth:`AgentRef.apply_state`, then
  ``StateApplied``: the state is durable). No request waits for a transfer. The graph's
  ``ship_interval_ms`` spaces the transfers (0, the default: one after every request). The bytes pass through
  the gateway, which holds the states the backup has not applied yet (the protocol's buffer).
* **Which request a state covers.** The next request may already be computing when a state is
  taken, so a state is matched to a request by its own ``seq`` (the rows the model folded in): the
  dispatcher counts the rows it sent the primary after each request, and knows the one call at the
  node not answered yet. States that match no request (a call whose fate is unknown, e.g. one that
  timed out) make it read the primary's count again, between two requests.
* **The input log.** Every input of the node since its last durable state is kept by ``seq``.
* **The policy** is the service's ``replication`` param: ``nspb`` (all of the above),
  ``stop-and-copy`` (Remus: the same copies, but a node's output is held until ``ReleaseOutput``,
  i.e. until the state after it is applied at the backup; the primary computes on meanwhile, and a
  failover's replayed outputs replace the dead primary's held ones: :meth:`Replication.released`),
  or ``none`` (no backup is placed; a failed primary is a ``Restore``: the node starts over on its
  app's route).
* **A failed primary** (its agent is gone, it does not hold the model any more, or the controller
  moved the app's route to another server): where the node goes is the controller's decision, one
  control loop for the whole cluster. The request at the node waits for the app's route to leave
  the dead server: the core switches an app with a warm pinned copy to it at once when it declares
  the server failed (route kind ``promoted``). Then the node reports ``Crashed``; on
  ``Promote(node, k)``, if the new route is the backup (which holds the state after ``k``; an apply
  under way is awaited first), the backup is the primary; ``Replay(node, k + 1)`` computes the
  logged inputs after ``k`` on it in ``seq`` order (their outputs were released already and are not
  sent again: the replay rebuilds the state); then the request that found the failure is computed
  there, and the graph goes on. ``PlaceBackup`` asks for a new backup, which the newest state is
  shipped to. A primary whose model is gone while its server lives on (``ModelNotLoadedError``)
  moves no route by itself, since the server heartbeats: the call primitive reports it to the
  controller (``copies.report_model_lost``), whose core promotes the backup as for a crash, and
  the node follows as above. Without a backup holding a state (both copies gone, the first one
  not placed yet, or the route went elsewhere) the node goes on at the app's new route, its state
  lost (``none``, counted in ``lost``): a route on another server, or, for a model its live server
  lost, the same server's new route once the core has reloaded the model in place (it unroutes
  the app meanwhile); the request that found the failure is computed there.

Not carried out yet (docs/hams.md, "What comes next"): holding a client's answer until every stateful
model is durable past it (``ReleaseToClient``), and, after a failover, the ``Replay`` of the nodes
downstream and the ``Rollback`` of the stateful models downstream. Both matter only when a replayed
output can differ from the one released (a non-deterministic model); each replayed output is
compared with the logged one and a difference counted (``divergent`` in :meth:`describe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    FailsoftError,
    InvalidRequestError,
    NoRouteError,
)
from failsoft.orchestration.copies import CopyRequest
from failsoft.policies import registry
from failsoft.policies.replication.interface import (
    ApplyState,
    BackupPlaced,
    Command,
    Crashed,
    Event,
    OutputComputed,
    PlaceBackup,
    Promote,
    ReleaseOutput,
    ReplicationProtocol,
    Restore,
    Role,
    SendState,
    StateApplied,
    StateShipped,
)
from failsoft.runtime.gateway.dispatch.calls import CallResult, CallStatus, Target, Watch, call_on_route
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext
from failsoft.runtime.gateway.routes import Route
from failsoft.runtime.loop import spawn
from failsoft.services import GraphParams

log = logging.getLogger(__name__)
POLICY = "nspb"
RETRY_S = 0.2  # between tries of a state transfer or a backup placement that failed
SHIP_TRIES = 50  # tries at RETRY_S; then the transfer is retried every SLOW_RETRY_S, never dropped
SLOW_RETRY_S = 1.0
REPLAY_TIMEOUT_S = 10.0  # per replayed request
UNCERTAIN = (DeadlineExceededError, asyncio.CancelledError)  # the copy may have computed it, or not
PIN_WAIT_S = 60.0  # how long a backup placement waits for its copy to be published ready
UNPIN_ON_CLOSE_S = 2.0


@dataclass(frozen=True, slots=True)
class Copy:
    """A copy of a node's model: the server, the name its agent holds it under, the variant."""

    server: str
    app: str
    variant: str


@dataclass
class NodeCopies:
    """The runtime side of one stateful node (the protocol object keeps the protocol's side)."""

    name: str
    app: str
    family: str
    primary: Copy | None = None
    backup: Copy | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    rows_now: int | None = None  # the primary's model seq (rows folded in); None: to be read again
    rows: OrderedDict[int, int] = field(default_factory=OrderedDict)  # request seq -> rows after it
    pending: tuple[int, int] | None = None  # the call at the primary not answered yet: (seq, rows)
    inputs: OrderedDict[int, Any] = field(default_factory=OrderedDict)  # since the last durable state
    buffered: dict[int, bytes] = field(default_factory=dict)  # shipped, not applied
    applying: asyncio.Task[None] | None = None
    shipped_at: float | None = None  # when the last transfer took its state (ship_interval_ms)
    held: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # stop-and-copy: until released
    latest: dict[int, Any] = field(default_factory=dict)  # held outputs, the newest computation of each
    placing: bool = False
    last_failed: str | None = None
    failovers: int = 0
    replayed: int = 0
    divergent: int = 0
    lost: int = 0  # failovers without a backup state: the node started over


class Replication:
    """Primary-backup copies of a graph's stateful nodes, driven by a replication protocol object."""

    def __init__(
        self,
        service: str,
        graph: GraphParams,
        context: DispatchContext,
        outputs: dict[str, OrderedDict[int, Any]],
        log_limit: int,
        policy: str = POLICY,
    ) -> None:
        self.service = service
        self.context = context
        self.outputs = outputs  # the graph dispatcher's edge logs: what a replay compares with
        self.log_limit = log_limit
        self.ship_interval_s = graph.ship_interval_ms / 1000.0
        self.holds = policy == "stop-and-copy"  # outputs wait until their state is durable (Remus)
        self.protocol: ReplicationProtocol = registry.make("replication", policy, graph)
        self.nodes: dict[str, NodeCopies] = {}
        for n in graph.nodes:
            if n.stateful:
                app = context.apps.get(n.app)
                self.nodes[n.name] = NodeCopies(n.name, n.app, app.family if app else "")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self.owner = f"graph:{service}"

    # start-up and reports --------------------------------------------------------------------
    def start(self) -> None:
        """Place the backups (once, from the event loop): to the protocol, no backup is there yet."""
        if self._started:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._started = True
        for name in self.nodes:
            self._handle(Crashed(name, Role.BACKUP))

    def serving(self, node: str) -> bool:
        """Whether a primary the node holds serves it while its app has no route (never: a promoted
        backup is the app's route, published by the controller)."""
        return False

    def describe(self) -> dict[str, Any]:
        nodes: dict[str, Any] = {}
        for name, n in self.nodes.items():
            rep = getattr(self.protocol, "replicas", {}).get(name)
            nodes[name] = {
                "primary": n.primary.server if n.primary else None,
                "backup": n.backup.server if n.backup else None,
                "durable": rep.durable if rep is not None else None,
                "backup_holds": rep.held if rep is not None and rep.has_backup else None,
                "failovers": n.failovers,
                "shipping": None
                if rep is None
                else {  # where the transfers stand (diagnostics)
                    "epoch": rep.epoch,
                    "in_flight": rep.in_flight,
                    "applying": rep.applying,
                    "buffered": sorted(rep.buffered),
                    "bytes_for": sorted(n.buffered),
                    "computed": getattr(self.protocol, "computed", {}).get(name),
                },
                "replayed": n.replayed,
                "divergent": n.divergent,
                "lost": n.lost,
            }
        return {"policy": self.protocol.name, "nodes": nodes}

    async def close(self) -> None:
        """Stop the transfers and placements; give the backups up."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        unpins = [self._unpin(n.backup) for n in self.nodes.values() if n.backup is not None]
        with contextlib.suppress(TimeoutError):  # the controller may be gone already
            await asyncio.wait_for(asyncio.gather(*unpins, return_exceptions=True), UNPIN_ON_CLOSE_S)

    # the request path ------------------------------------------------------------------------
    async def call(self, name: str, seq: int, batch: Any, deadline: float, request_id: str) -> Answer:
        """Compute request ``seq`` at stateful node ``name`` (the caller keeps ``seq`` order), on its
        primary; a primary found failed is replaced by its backup (promotion and replay) first."""
        node = self.nodes[name]
        clock = self.context.clock
        started, attempts = clock.now(), 0
        async with node.lock:
            while True:
                left = deadline - clock.now()
                if left <= 0:
                    waited_ms = (clock.now() - started) * 1000
                    raise NoRouteError(f"app {node.app!r}: no live copy in time (waited {waited_ms:.0f} ms)")
                copy = node.primary or self._route_copy(node)
                if copy is None:
                    await self.context.routes.wait_route_change(node.app, None, left)
                    continue
                node.primary = copy
                attempts += 1
                sent_on = self.context.routes.route(node.app)  # the route a failure must see move
                rows = len(batch)
                node.pending = None if node.rows_now is None else (seq, node.rows_now + rows)
                try:
                    result = await self._infer(node, copy, batch, deadline, f"{request_id}#{attempts}")
                except (InvalidRequestError, ConfigError):
                    node.pending = None  # bad input, refused before computing: the count holds
                    raise
                except BaseException:  # (reported by the call) computed or not: read the count again
                    node.pending, node.rows_now = None, None
                    raise
                if result.status is CallStatus.MOVED:
                    node.pending = None
                    log.warning(
                        "service %s, node %s: primary on %s failed: %s",
                        self.service, name, copy.server, result.error,
                    )  # fmt: skip
                    await self._failover(node, seq, copy, sent_on, deadline)
                    continue
                if result.status is CallStatus.REFUSED:
                    node.pending = None  # refused or dropped before computing: the count holds
                    result.raise_error()
                if result.status is CallStatus.DEADLINE:
                    node.pending, node.rows_now = None, None  # computed or not: read the count again
                    result.raise_error()
                outputs = result.outputs
                self._computed(node, seq, batch, rows)
                route = self.context.routes.route(node.app)
                on_route = route is not None and route.server == copy.server
                return Answer(
                    outputs=outputs,
                    server=copy.server,
                    variant=copy.variant,
                    degraded=bool(route and on_route and route.degraded),
                    accuracy=route.accuracy if route else 0.0,
                    kind=route.kind if route is not None and on_route else "primary",
                    attempts=attempts,
                )

    def _route_copy(self, node: NodeCopies) -> Copy | None:
        route = self.context.routes.route(node.app)
        return None if route is None else Copy(route.server, node.app, route.variant)

    async def _infer(
        self, node: NodeCopies, copy: Copy, batch: Any, deadline: float, call_id: str
    ) -> CallResult:
        """The copy's call; MOVED when the controller moved the app's route off the copy's server
        meanwhile (the controller's copy failed: a hung server, for one)."""
        watch = Watch.leaves_server(node.app, copy.server)
        target = Target(copy.server, copy.app, copy.variant)
        return await call_on_route(self.context, target, batch, call_id, deadline, watch)

    async def _route_moves(self, app: str, dead: Copy, sent_on: Route | None, timeout_s: float) -> bool:
        """Wait until the controller has decided where ``app`` goes after ``dead`` failed under a
        call sent while its route was ``sent_on``: a route on another server (the backup promoted,
        a fresh copy), or a new route on the same one (the model reloaded in place: its server
        lives). False at the timeout (not decided yet)."""
        routes, clock = self.context.routes, self.context.clock
        deadline = clock.now() + timeout_s
        while True:
            route = routes.route(app)
            if route is not None and (route.server != dead.server or route != sent_on):
                return True
            left = deadline - clock.now()
            if left <= 0:
                return False
            await routes.wait_route_change(app, route, left)

    def _computed(self, node: NodeCopies, seq: int, batch: Any, rows: int) -> None:
        node.pending = None
        if node.rows_now is not None:
            node.rows_now += rows
            node.rows[seq] = node.rows_now
            _bound(node.rows, self.log_limit)
        if self.protocol.name == "none":  # no backup: nothing is ever replayed
            self._handle(OutputComputed(node.name, seq))
            return
        if self.holds:
            node.held.setdefault(seq, asyncio.get_running_loop().create_future())
        node.inputs[seq] = batch
        if _bound(node.inputs, self.log_limit):
            log.warning(
                "service %s, node %s: input log full; a replay may miss requests", self.service, node.name
            )
        self._handle(OutputComputed(node.name, seq))

    # failover ----------------------------------------------------------------------------------
    async def _failover(
        self, node: NodeCopies, seq: int, dead: Copy, sent_on: Route | None, deadline: float
    ) -> None:
        """The primary ``dead`` failed while request ``seq`` waited at the node (the lock is held),
        its call sent while the app's route was ``sent_on``.

        The controller decides where the app goes (it promotes a warm pinned backup, the one that
        holds the state, or reloads a model its live server lost in place): this waits until it has
        decided (:meth:`_route_moves`; no longer than the request's deadline: the next request
        finds the failure again), then promotes the backup if the route is the backup, or starts
        the node over on the route, its state lost (``lost``): the caller computes the request
        there."""
        left = deadline - self.context.clock.now()
        if not await self._route_moves(node.app, dead, sent_on, left):
            return  # not decided yet: the caller's deadline passes, the next request retries
        node.failovers += 1
        node.last_failed = dead.server
        commands = self.protocol.handle(Crashed(node.name, Role.PRIMARY))
        if node.applying is not None:  # applies are atomic: promote the state being applied
            await asyncio.gather(node.applying, return_exceptions=True)
        promote = next((c for c in commands if isinstance(c, Promote) and c.node == node.name), None)
        restore = next((c for c in commands if isinstance(c, Restore) and c.node == node.name), None)
        route = self.context.routes.route(node.app)
        backup = node.backup
        promoted = (
            backup is not None
            and route is not None
            and (route.server, route.variant) == (backup.server, backup.variant)
        )
        if promote is not None and promoted:
            node.primary, node.backup = backup, None
            node.buffered.clear()
            log.warning(
                "service %s, node %s: backup on %s promoted with the state after request %d; replaying %d",
                self.service, node.name, backup.server if backup else None, promote.seq,
                sum(1 for s in node.inputs if promote.seq < s < seq),
            )  # fmt: skip
            await self._replay(node, promote.seq, seq)
        elif promote is not None or restore is not None:  # no copy holds a state: start over (none)
            node.lost += 1
            node.primary, node.rows_now = None, None  # the app's route, whatever state it has
            node.inputs.clear()
            if backup is not None and not promoted:  # the controller routed elsewhere: give it up
                node.backup = None
                self._spawn(self._unpin(backup))
            log.warning(
                "service %s, node %s: no backup state; the node's state is lost", self.service, node.name
            )
        self._run([c for c in commands if not isinstance(c, (Promote, Restore))])

    async def _replay(self, node: NodeCopies, k: int, seq: int) -> None:
        """Compute the logged inputs after ``k`` and before ``seq`` on the new primary, in order."""
        copy = node.primary
        assert copy is not None
        try:
            node.rows_now = await self._read_rows(copy)
            for s in [s for s in node.inputs if k < s < seq]:
                batch = node.inputs[s]
                agent = self.context.agents(copy.server)
                out = await agent.infer(
                    copy.app,
                    copy.variant,
                    batch,
                    timeout_s=REPLAY_TIMEOUT_S,
                    request_id=f"replay/{node.name}/{s}",
                )
                node.replayed += 1
                logged = self.outputs.get(node.name)
                released = None if logged is None else logged.get(s)
                if released is not None and not np.array_equal(np.asarray(released), np.asarray(out)):
                    node.divergent += 1
                    log.warning(
                        "service %s, node %s: replay of request %d differs", self.service, node.name, s
                    )
                node.rows_now += len(batch)
                node.rows[s] = node.rows_now
                if self.holds and s in node.held:
                    node.latest[s] = out
                self._handle(OutputComputed(node.name, s))
        except FailsoftError as exc:  # the new primary failed too: the next call finds it out
            node.rows_now = None
            log.warning("service %s, node %s: replay stopped: %s", self.service, node.name, exc)

    # commands ----------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        self._run(self.protocol.handle(event))

    def _run(self, commands: list[Command]) -> None:
        """Carry out what the protocol asked; outputs are already released (the dispatcher forwards
        every output at once), and a failover handles its own Promote, Replay and Restore."""
        for c in commands:
            if isinstance(c, SendState):
                self._spawn(self._ship(c))
            elif isinstance(c, ApplyState):
                # the bytes and the copy are fixed now, when the protocol counts the apply as under
                # way, never re-read when the task starts: bytes taken then threw away a newer
                # transfer of the same state buffered meanwhile (its apply found nothing and the
                # state was never durable again), and an apply given up because a failover began
                # before its task started left the promoted backup without a state the failover
                # took it to hold (the replay skipped that request: every later answer differed)
                node = self.nodes[c.node]
                data = node.buffered.pop(c.seq, None)
                node.buffered = {s: b for s, b in node.buffered.items() if s > c.seq}
                node.applying = self._spawn(self._apply(c, node.backup, data))
            elif isinstance(c, PlaceBackup):
                self._spawn(self._place(c.node))
            elif isinstance(c, ReleaseOutput) and c.node in self.nodes:
                held = self.nodes[c.node].held.pop(c.seq, None)
                if held is not None and not held.done():
                    held.set_result(None)

    async def released(self, name: str, seq: int, outputs: Any, deadline: float) -> Any:
        """``stop-and-copy``: the node's output for ``seq`` once the state after it is durable (the
        newest computation of it: a failover's replay replaces the dead primary's); at once otherwise."""
        node = self.nodes[name]
        held = node.held.get(seq)
        if not self.holds or held is None:
            return outputs
        node.latest[seq] = node.latest.get(seq, outputs)
        clock = self.context.clock
        timer = asyncio.ensure_future(clock.sleep(max(deadline - clock.now(), 0.0)))
        try:
            await asyncio.wait({held, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if not held.done():
            node.latest.pop(seq, None)
            raise DeadlineExceededError(
                f"app {node.app!r}: the state after request {seq} was not at the backup in time"
            )
        node.held.pop(seq, None)
        return node.latest.pop(seq, outputs)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        return spawn(coro, f"graph-{self.service}-{coro.__qualname__}", self._tasks)

    async def _ship(self, c: SendState) -> None:
        """Take the primary's newest state (while it computes on) and buffer it for the backup.

        The protocol keeps one transfer in flight per node and asks for the next only when this one
        is shipped, so a transfer is never dropped while its epoch lasts: after ``SHIP_TRIES`` quick
        tries it goes on every ``SLOW_RETRY_S`` (a primary whose state cannot be read now may answer
        later; one that died ends the epoch with a failover)."""
        node = self.nodes[c.node]
        clock = self.context.clock
        if self.ship_interval_s > 0 and node.shipped_at is not None:  # the newest state, not sooner
            await clock.sleep(max(0.0, node.shipped_at + self.ship_interval_s - clock.now()))
        node.shipped_at = clock.now()
        tries, pause = 0, 0.0
        while True:
            if pause:
                await clock.sleep(pause)
            copy = node.primary
            if self._epoch(c.node) != c.epoch:
                return  # a role change: the protocol asks again
            if copy is None:  # not anchored yet (a failed first read, a lost state): the next call sets it
                tries += 1
                pause = RETRY_S if tries < SHIP_TRIES else SLOW_RETRY_S
                continue
            pause = RETRY_S  # after a failed read; a state whose request is unknown retries at once
            try:
                if node.rows_now is None:
                    async with node.lock:  # between two requests: read the count again
                        if node.primary == copy and node.rows_now is None:
                            node.rows_now = await self._read_rows(copy)
                            node.rows[self._computed_seq(c.node)] = node.rows_now
                data = await self.context.agents(copy.server).state(copy.app, copy.variant)
            except FailsoftError as exc:
                log.debug("service %s, node %s: state from %s: %s", self.service, c.node, copy.server, exc)
            else:
                if self._epoch(c.node) != c.epoch:
                    return  # a role change while the state was read: it belongs to no backup now
                covered = self._covers(node, state_seq(data))
                if covered is not None:
                    node.buffered[covered] = data
                    self._handle(StateShipped(c.node, covered, c.epoch))
                    return
                node.rows_now = None  # a call's fate is unknown: read the count again, then retry
                pause = 0.0
            tries += 1
            if tries == SHIP_TRIES:
                log.warning(
                    "service %s, node %s: no state shipped after %d tries; trying every %.0f s",
                    self.service, c.node, SHIP_TRIES, SLOW_RETRY_S,
                )  # fmt: skip
            if tries >= SHIP_TRIES:
                pause = SLOW_RETRY_S

    def _covers(self, node: NodeCopies, rows: int) -> int | None:
        """The request a state of ``rows`` rows is the state after, if the dispatcher knows it."""
        if node.pending is not None and node.pending[1] == rows:
            return node.pending[0]
        return next((s for s, r in reversed(node.rows.items()) if r == rows), None)

    async def _apply(self, c: ApplyState, copy: Copy | None, data: bytes | None) -> None:
        """Apply state ``c.seq`` on ``copy``, the backup when the apply was commanded; then
        ``StateApplied``. Carried out even when a role change comes first (a failover, a rollback):
        the protocol counts an apply under way as the backup's state (applies are atomic), and a
        failover waits for it before it promotes the backup and replays what follows it."""
        node = self.nodes[c.node]
        try:
            if copy is None or data is None:
                if data is None and copy is not None:
                    log.error(  # the protocol now waits for this apply for good: say so
                        "service %s, node %s: no bytes for state %d", self.service, c.node, c.seq
                    )
                return
            try:
                await self.context.agents(copy.server).apply_state(copy.app, copy.variant, data)
            except FailsoftError as exc:
                log.warning(
                    "service %s, node %s: backup on %s failed: %s", self.service, c.node, copy.server, exc
                )
                if node.backup == copy:
                    node.backup = None
                    node.last_failed = copy.server
                    node.applying = None
                    self._spawn(self._unpin(copy))  # if its server lives on, free the memory
                    self._handle(Crashed(c.node, Role.BACKUP))
                return
            for s in [s for s in node.inputs if s <= c.seq]:  # durable: no replay goes below it
                del node.inputs[s]
        finally:
            if node.applying is asyncio.current_task():
                node.applying = None
        self._handle(StateApplied(c.node, c.seq, c.epoch))

    async def _place(self, name: str) -> None:
        """Load a backup copy on a server other than the primary's; then ``BackupPlaced``."""
        node = self.nodes[name]
        if node.placing:
            return
        node.placing = True
        try:
            while True:
                primary = node.primary or self._route_copy(node)
                if primary is None:
                    await self.context.routes.wait_route_change(node.app, None, 1.0)
                    continue
                if node.rows_now is None and node.primary in (None, primary):
                    async with node.lock:  # anchor the count before the first state is taken
                        if node.rows_now is None and node.primary in (None, primary):
                            with contextlib.suppress(FailsoftError):
                                node.rows_now = await self._read_rows(primary)
                                node.primary = primary
                                node.rows[self._computed_seq(name)] = node.rows_now
                copy = await self._load_backup(node, primary)
                if copy is not None and node.primary is not None and copy.server == node.primary.server:
                    self._spawn(self._unpin(copy))
                    continue  # the primary moved onto that server meanwhile (a failover): elsewhere
                if copy is not None:
                    node.backup = copy
                    log.info("service %s, node %s: backup on %s", self.service, name, copy.server)
                    self._handle(BackupPlaced(name))
                    return
                await self.context.clock.sleep(RETRY_S)
        finally:
            node.placing = False

    async def _load_backup(self, node: NodeCopies, primary: Copy) -> Copy | None:
        """Ask the core for a backup away from the primary's server (and, when another has room,
        from the server the last copy failed on); the copy once published ready (None: not now)."""
        tries: list[tuple[str, ...]] = [(primary.server, node.last_failed)] if node.last_failed else []
        tries.append((primary.server,))
        for away in tries:
            try:
                request = CopyRequest(node.app, primary.variant, self.owner, avoid=away)
                server = await self.context.copies.pin(request)
            except FailsoftError as exc:
                log.debug("service %s, node %s: no backup outside %s: %s", self.service, node.name, away, exc)
                continue
            if await self.context.routes.wait_pinned(node.app, server, primary.variant, PIN_WAIT_S):
                return Copy(server, node.app, primary.variant)
            return None
        return None

    async def _unpin(self, copy: Copy) -> None:
        try:
            await self.context.copies.unpin(copy.app, copy.server, self.owner)
        except FailsoftError as exc:
            log.warning("service %s: could not give the backup on %s up: %s", self.service, copy.server, exc)

    async def _read_rows(self, copy: Copy) -> int:
        return state_seq(await self.context.agents(copy.server).state(copy.app, copy.variant))

    def _epoch(self, node: str) -> int:
        return int(self.protocol.replicas[node].epoch)  # type: ignore[attr-defined]

    def _computed_seq(self, node: str) -> int:
        return int(self.protocol.computed[node])  # type: ignore[attr-defined]


def state_seq(data: bytes) -> int:
    """A state's ``seq`` (the rows its model folded in), read from its safetensors header alone."""
    (size,) = struct.unpack("<Q", data[:8])
    return int(json.loads(data[8 : 8 + size])["__metadata__"]["seq"])


def _bound(log_: OrderedDict[int, Any], limit: int) -> bool:
    dropped = False
    while len(log_) > limit:
        log_.popitem(last=False)
        dropped = True
    return dropped
