"""The ``slo`` dispatcher: Jellyfish at run time, clients with end-to-end SLOs mapped to workers.

A ``slo`` service's members are its *workers*: apps of one family, each placed and failed over by
the controller like any app (FailLite). Its *clients* register with the gateway
(:mod:`failsoft.runtime.gateway.slo_clients`: SLO, frame rate, first bandwidth guess), report the
bandwidth they measure, and send frames to ``POST /v2/models/{service}/infer`` with their client id.
This dispatcher, one per slo service in the gateway, carries out the step-1 policies
(:mod:`failsoft.policies.adaptation`) the way the simulator (:mod:`failsoft.sim.jellyfish`) does:

* **Planning** (:meth:`SloDispatcher.replan`): a frozen :class:`~failsoft.policies.adaptation.model.
  Snapshot` (each client's frame rate and latency budget per variant, from the harmonic mean of its
  last second of bandwidth reports and the measured server overhead; the live workers and the variant
  each serves now) goes to the ``jellyfish`` policy; the plan maps clients to workers, with a variant
  and a batch size per worker. It runs every ``SloParams.replan_s``, and at once when a client
  registers or leaves, when the routing table changes (a worker failed over or lost its route), and
  when a request finds its worker's server gone: the failed worker's clients are re-mapped to the
  live ones before the request is retried (Jellyfish meets FailLite).
* **Variant switches**: a worker whose planned variant is not its route's asks the orchestration
  core for that rung, a copy pinned on the route's server (``copies.pin``, owner ``slo:<service>``:
  the core plans the load at the warm-backup priority, counts it against the server's memory and
  publishes it), and keeps serving the old variant until the routing table shows the copy ready;
  then requests go to it. Pinning another rung on the same server replaces the copy (the core
  unloads the old one after its drain period, once the new one is warm); switching back to the
  route's variant needs no copy and unpins it. A request that finds its rung gone (ModelNotLoadedError)
  is retried on the route's variant: no request is dropped by a switch. The dispatcher never loads
  or unloads a model itself.
* **Per frame**: its server deadline is eq. 1's (:func:`~failsoft.policies.adaptation.network.
  server_deadline_s`: SLO minus the frame's transfer time at the client's estimated bandwidth, the
  RTT and the overhead), capped by the request's ``timeout``; the agent's serving queue, configured
  with the ``batch-lazy-drop`` discipline, batches up to ``max_batch`` and drops lazily a request that
  cannot make it even alone. A dropped request (lazily, refused by admission, or its client mapped to
  no worker) is answered 200 with ``dropped: true`` and no outputs, as the paper's server answers.
  Every answer carries ``variant``, ``server``, ``dropped``, ``residence_ms`` (receipt to answer in
  the gateway, which the client subtracts from its round trip to measure its upload time) and
  ``next_frame_px`` (:func:`~failsoft.policies.adaptation.network.next_frame_rung`).

Variants and frame sizes: the family's variants, by accuracy, take frame sizes from
:data:`SIZE_LADDER_PX` (the EfficientNet B0-B7 input sizes of the step-1 ladder), spread evenly from
its smallest to its largest; a family whose models all take one input (the digits families) then
still has the real trade-off Jellyfish adapts: a more accurate variant wants a larger frame, which
takes longer to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.adaptation_data import DEFAULT_BATCH_COST, LOW_RES_PX, upscaled_accuracy
from failsoft.domain import Family
from failsoft.errors import (
    ConfigError,
    FailsoftError,
    InvalidRequestError,
    ModelNotLoadedError,
    OverloadedError,
    UnknownNameError,
)
from failsoft.orchestration.copies import CopyRequest
from failsoft.policies import registry
from failsoft.policies.adaptation.interface import AdaptationPolicy
from failsoft.policies.adaptation.model import ClientSnapshot, Ladder, Plan, Rung, Snapshot, WorkerPlan
from failsoft.policies.adaptation.network import (
    BandwidthWindow,
    OverheadTracker,
    carried_frame_rung,
    check_bandwidth,
    check_fps,
    check_slo,
    frame_kbit,
    latency_budgets_ms,
    next_frame_rung,
    server_deadline_s,
)
from failsoft.runtime.gateway.dispatch.calls import CallStatus, Target, Watch, call_on_route
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.gateway.routes import Route
from failsoft.runtime.gateway.slo_clients import router as client_router
from failsoft.runtime.loop import spawn
from failsoft.services import Service, ServiceMode, SloParams

if TYPE_CHECKING:
    from fastapi import APIRouter

log = logging.getLogger(__name__)
SIZE_LADDER_PX = (224, 240, 260, 300, 380, 456, 528, 600)  # EfficientNet B0-B7 inputs (step 1)
DEFAULT_BANDWIDTH_KBPS = 20_000.0  # a client's first estimate when it states none
DEFAULT_RTT_MS = 1.0
MAX_RTT_MS = 10_000.0
MAX_CLIENTS = 1024  # per service
IDLE_S = 10.0  # a client that sends nothing (no frame, no report) this long has left
SEED = 0
DISPATCH_WINDOW_S = 5.0  # dispatch times older than this are forgotten
DISPATCH_WINDOW_CALLS = 64
PIN_WAIT_S = 60.0  # how long a switch waits for its rung's copy to be published ready
UNPIN_ON_CLOSE_S = 2.0


def frame_sizes_px(count: int) -> tuple[int, ...]:
    """Frame sizes for ``count`` variants: evenly spread over :data:`SIZE_LADDER_PX`, smallest first."""
    if not 1 <= count <= len(SIZE_LADDER_PX):
        raise ConfigError(f"a slo family has 1 to {len(SIZE_LADDER_PX)} variants; got {count}")
    picks = np.round(np.linspace(0, len(SIZE_LADDER_PX) - 1, count)).astype(int) if count > 1 else [0]
    return tuple(SIZE_LADDER_PX[int(i)] for i in picks)


def service_ladder(family: Family, max_batch: int, low_res_px: tuple[int, ...] = LOW_RES_PX) -> Ladder:
    """The family's variants, by accuracy, as an adaptation ladder with growing frame sizes, and the
    least accurate one also fed smaller frames (``low_res_px``, upscaled; their accuracy declared by
    :func:`~failsoft.adaptation_data.upscaled_accuracy`) for clients whose uplink cannot carry 224 px."""
    ordered = sorted(family.variants, key=lambda v: (v.accuracy, v.latency_ms, v.name))
    sizes = frame_sizes_px(len(ordered))
    rungs = [Rung(v, px, frame_kbit(px)) for v, px in zip(ordered, sizes, strict=True)]
    smallest = rungs[0]
    for px in sorted(set(low_res_px)):
        accuracy = upscaled_accuracy(smallest.accuracy, px, smallest.input_px)
        rungs.append(Rung(smallest.variant, smallest.input_px, frame_kbit(px), px, accuracy))
    return Ladder.build(rungs, max_batch, DEFAULT_BATCH_COST)


class DispatchTimes:
    """The one-way dispatch time (gateway to worker's answer, less the compute), robustly.

    A call's time minus the profile's compute also holds the time the frame waited in the worker's
    queue and any stall of this machine; an EWMA of it alone lets one stall (a 250 ms pause on the
    shared CPU was measured) inflate the overhead, shrink every budget, drop every frame before a
    call is made, and so never be measured again: the service stays dark. So the dispatch time is
    the median of the last ``window_s`` of calls, and back at ``initial_ms`` when none is left.

    Its spread is the overhead's *noise* term (the public server's, 2 ms by default): twice the
    distance from the median to the 90th percentile, both ways of a call. Without it a ladder whose
    models compute in microseconds (the digits) leaves a frame ``2 l(b)`` of slack, tens of
    microseconds, and every scheduling hiccup of the gateway drops it.
    """

    def __init__(
        self, initial_ms: float, initial_noise_ms: float, window_s: float = DISPATCH_WINDOW_S
    ) -> None:
        self.initial_ms, self.initial_noise_ms, self.window_s = initial_ms, initial_noise_ms, window_s
        self._seen: deque[tuple[float, float]] = deque(maxlen=DISPATCH_WINDOW_CALLS)

    def observe(self, now_s: float, one_way_ms: float) -> None:
        self._seen.append((now_s, one_way_ms))

    def _recent(self, now_s: float) -> list[float]:
        while self._seen and self._seen[0][0] < now_s - self.window_s:
            self._seen.popleft()
        return [ms for _, ms in self._seen]

    def dispatch_ms(self, now_s: float) -> float:
        recent = self._recent(now_s)
        return statistics.median(recent) if recent else self.initial_ms

    def noise_ms(self, now_s: float) -> float:
        """At least the initial noise; more when the recent calls spread wider."""
        recent = self._recent(now_s)
        if len(recent) < 2:
            return self.initial_noise_ms
        spread = float(np.percentile(recent, 90)) - statistics.median(recent)
        return max(self.initial_noise_ms, 2.0 * spread)


@dataclass(slots=True)
class SloClient:
    """A registered client: its SLO, frame rate, round trip, bandwidth window and last frame size."""

    id: str
    slo_ms: float
    fps: float
    rtt_ms: float
    window: BandwidthWindow
    last_seen_s: float
    frame_rung: int = 0


@dataclass(slots=True)
class _Worker:
    """A member app on its route's server: the (app, variant) its requests go to now, the rung being
    switched to, and the variant of the copy pinned for it on that server (None: none)."""

    member: str
    server: str
    route_variant: str
    serving: tuple[str, str]
    loading: str | None = None
    pinned: str | None = None


class SloDispatcher(Dispatcher):
    """Clients mapped to the service's workers by the adaptation policy; frames batched, dropped lazily."""

    mode = ServiceMode.SLO

    def __init__(self, service: Service, context: DispatchContext) -> None:
        super().__init__(service, context)
        if not isinstance(service.params, SloParams):
            raise ConfigError(f"service {service.name!r}: an slo service takes SloParams")
        self.params = service.params
        self.members = service.members
        self.family = _family_of(service, context)
        self.ladder = service_ladder(self.family, self.params.max_batch)
        self.policy: AdaptationPolicy = registry.make("adaptation", self.params.policy, SEED)
        self.overhead = OverheadTracker()
        self.dispatch_times = DispatchTimes(self.overhead.dispatch_ms, self.overhead.noise_ms)
        self.clients: dict[str, SloClient] = {}
        self.plan: Plan | None = None
        self.workers: dict[str, _Worker] = {}
        self.suspect: dict[str, Route] = {}  # member -> the route a request found dead
        self.in_flight: dict[str, int] = dict.fromkeys(service.members, 0)  # pooled plans: JSQ
        self.replans = 0
        self.switches = 0  # variant switches started (a background load, or back to the route's)
        self._generation = 0
        self._lock: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.Task[None] | None = None
        self.owner = f"slo:{service.name}"

    # clients ---------------------------------------------------------------------------------
    async def register(
        self, slo_ms: Any, fps: Any, bandwidth_kbps: Any = None, rtt_ms: Any = None
    ) -> dict[str, Any]:
        """Add a client (ConfigError naming the value when one is out of bounds) and re-plan; a
        client that states no SLO gets the service's (``SloParams.slo_ms``)."""
        slo_ms = self.params.slo_ms if slo_ms is None else slo_ms
        slo = check_slo(_number(slo_ms, "slo_ms"), self.ladder)
        rate = check_fps(_number(fps, "fps"))
        kbps = DEFAULT_BANDWIDTH_KBPS if bandwidth_kbps is None else bandwidth_kbps
        kbps = check_bandwidth(_number(kbps, "bandwidth_kbps"), "bandwidth_kbps")
        rtt = DEFAULT_RTT_MS if rtt_ms is None else _number(rtt_ms, "rtt_ms")
        if not 0 <= rtt <= MAX_RTT_MS:
            raise ConfigError(f"rtt_ms must be in [0, {MAX_RTT_MS:g}]; got {rtt_ms!r}")
        if len(self.clients) >= MAX_CLIENTS:
            raise OverloadedError(f"service {self.service.name!r} has {MAX_CLIENTS} clients already", 5.0)
        now = self.context.clock.now()
        client = SloClient(uuid.uuid4().hex[:16], slo, rate, rtt, BandwidthWindow(kbps), now)
        self.clients[client.id] = client
        await self.replan_now()
        return {"client": client.id, "service": self.service.name, **self.client_state(client)}

    async def unregister(self, client_id: str) -> None:
        self.client(client_id)
        del self.clients[client_id]
        await self.replan_now()

    def report_bandwidth(self, client_id: str, kbps: Any) -> dict[str, Any]:
        client = self.client(client_id)
        now = self.context.clock.now()
        client.window.report(now, check_bandwidth(_number(kbps, "bandwidth_kbps"), "bandwidth_kbps"))
        client.last_seen_s = now
        return {"client": client_id, "bandwidth_kbps": round(client.window.estimate(now), 3)}

    def client(self, client_id: Any) -> SloClient:
        client = self.clients.get(client_id) if isinstance(client_id, str) else None
        if client is None:
            raise UnknownNameError(
                f"service {self.service.name!r}: client {str(client_id)[:40]!r} is not registered "
                "(register with POST /v2/clients)"
            )
        return client

    def client_state(self, client: SloClient) -> dict[str, Any]:
        wp = self._worker_plan(client)
        return {
            "slo_ms": client.slo_ms,
            "fps": client.fps,
            "worker": None if wp is None else wp.worker,
            "variant": None if wp is None else self.ladder.rungs[wp.rung].variant.name,
            "frame_px": self.ladder.rungs[client.frame_rung].px,
            "frame_sizes_px": sorted({r.px for r in self.ladder.rungs}),
        }

    # the gateway's hooks ---------------------------------------------------------------------
    @classmethod
    def http_routes(cls, dispatchers: Mapping[str, Dispatcher]) -> APIRouter:
        """``POST /v2/clients`` and the rest (:mod:`failsoft.runtime.gateway.slo_clients`)."""
        return client_router({n: d for n, d in dispatchers.items() if isinstance(d, SloDispatcher)})

    async def start(self) -> None:
        """Run :meth:`run` (the re-planning loop) until :meth:`close`."""
        if self._loop is None:
            self._loop = asyncio.ensure_future(self.run())

    async def close(self) -> None:
        """Stop the re-planning loop and the switches under way; give the pinned rungs up."""
        tasks = [*self._tasks, *([self._loop] if self._loop is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop = None
        held = [w for w in self.workers.values() if w.pinned is not None]
        unpins = [self._unpin(w.member, w.server) for w in held]
        with contextlib.suppress(TimeoutError):  # the controller may be gone already
            await asyncio.wait_for(asyncio.gather(*unpins, return_exceptions=True), UNPIN_ON_CLOSE_S)

    # planning --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Re-plan every ``replan_s`` and whenever the routing table changes (:meth:`start` runs it)."""
        while True:
            try:
                await self.replan_now()
            except Exception:  # a planning bug must not stop serving: the last plan stays
                log.exception("service %s: planning failed", self.service.name)
            await self.context.routes.wait_change(self.params.replan_s)

    async def replan_now(self) -> None:
        """Plan once; callers that waited while another plan ran take that one (it saw their change
        only if it started after it: the generation tells)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        asked = self._generation
        async with self._lock:
            if self._generation > asked:
                return  # a plan started after this call was made: it saw everything this one would
            self._generation += 1
            await self.replan()

    async def replan(self) -> None:
        now = self.context.clock.now()
        live = self._live_workers()
        for c in [c for c in self.clients.values() if now - c.last_seen_s > IDLE_S]:
            log.info("service %s: client %s silent for %.0f s: it has left", self.service.name, c.id, IDLE_S)
            del self.clients[c.id]
        clients = list(self.clients.values())
        if not live or not clients:
            self.plan = None
            self.replans += 1
            return
        self._track_overhead()  # old measurements expire even when no frame is served
        overhead = self.overhead.total_ms
        snap = Snapshot(
            self.ladder,
            tuple(
                ClientSnapshot(
                    c.id,
                    c.fps,
                    latency_budgets_ms(
                        self.ladder, c.slo_ms, c.fps, c.window.estimate(now), c.rtt_ms, overhead
                    ),
                )
                for c in clients
            ),
            tuple(w.member for w in live),
            tuple(self.ladder.index(w.serving[1]) for w in live),
        )
        plan = await asyncio.to_thread(self.policy.plan, snap)
        self.plan = plan
        self.replans += 1
        for wp in plan.workers:
            self._switch(wp.worker, self.ladder.rungs[wp.rung].variant.name)
        for c in clients:
            c.frame_rung = self._next_rung(c, now)

    def _live_workers(self) -> list[_Worker]:
        """Members with a route that no request found dead; a moved route starts a fresh worker."""
        live = []
        for member in self.members:
            route = self.context.routes.route(member)
            if route is None:
                self.workers.pop(member, None)
                continue
            if self.suspect.get(member) == route:
                continue
            self.suspect.pop(member, None)
            w = self.workers.get(member)
            if w is None or (w.server, w.route_variant) != (route.server, route.variant):
                if w is not None:
                    self._release(w)  # the controller moved the route: a fresh worker
                w = self.workers[member] = _Worker(
                    member, route.server, route.variant, (member, route.variant)
                )
            live.append(w)
        return live

    def _switch(self, member: str, variant: str) -> None:
        w = self.workers.get(member)
        if w is None or variant in (w.serving[1], w.loading):
            return
        self.switches += 1
        if variant == w.route_variant:  # the controller holds it: switch now, give the rung up
            w.serving, w.loading = (member, variant), None
            self._release(w)
            return
        w.loading = variant
        self._spawn(self._pin(w, variant))

    async def _pin(self, w: _Worker, variant: str) -> None:
        """Ask the core for ``variant`` on ``w``'s server; serve it once published ready."""
        try:
            await self.context.copies.pin(CopyRequest(w.member, variant, self.owner, w.server))
        except FailsoftError as exc:  # no room, or the server is gone: keep serving what it has
            log.warning(
                "service %s: %s cannot switch to %s on %s: %s",
                self.service.name, w.member, variant, w.server, exc,
            )  # fmt: skip
            if w.loading == variant:
                w.loading = None
            return
        w.pinned = variant
        if self.workers.get(w.member) is not w:  # the worker moved while the core was asked
            self._release(w)
            return
        ready = await self.context.routes.wait_pinned(w.member, w.server, variant, PIN_WAIT_S)
        if not ready:  # its load failed (the core keeps the rung it replaced, if any) or took too long
            copy = self.context.routes.pinned_copy(w.member, w.server)
            w.pinned = None if copy is None else copy.variant
            if w.loading == variant:
                w.loading = None
            return
        if self.workers.get(w.member) is w and w.loading == variant:
            w.serving, w.loading = (w.member, variant), None

    def _release(self, w: _Worker) -> None:
        """Give ``w``'s pinned rung up (the core unloads it after its drain period)."""
        if w.pinned is None:
            return
        w.pinned = None
        successor = self.workers.get(w.member)
        if successor is not None and successor is not w and successor.server == w.server and successor.pinned:
            return  # a fresh worker on the same server re-pinned the copy: it is its now
        self._spawn(self._unpin(w.member, w.server))

    async def _unpin(self, member: str, server: str) -> None:
        try:
            await self.context.copies.unpin(member, server, self.owner)
        except FailsoftError as exc:  # the controller is away: its gc cannot free it, say so
            log.warning("service %s: could not unpin %s on %s: %s", self.service.name, member, server, exc)

    def _spawn(self, coro: Any) -> None:
        spawn(coro, f"slo-{self.service.name}-{coro.__qualname__}", self._tasks)

    def _worker_plan(self, client: SloClient) -> WorkerPlan | None:
        """The client's worker: the one the plan maps it to, or, when the plan pools the workers (the
        EDF baselines' one shared queue), the live planned worker with the fewest frames in flight."""
        if self.plan is None:
            return None
        if not self.plan.pooled:
            return self.plan.worker_of(client.id)
        live = [wp for wp in self.plan.workers if wp.worker in self.workers]
        return min(live, key=lambda wp: self.in_flight[wp.worker], default=None)

    def _next_rung(self, client: SloClient, now: float) -> int:
        wp = self._worker_plan(client)
        if wp is not None and self.plan is not None and self.plan.pooled:
            # the baselines' client adapts to throughput only (section 7.3, as AWStream)
            return carried_frame_rung(self.ladder, wp.rung, client.fps, client.window.estimate(now))
        w = self.workers.get(wp.worker) if wp else None
        rung = None
        if wp is not None and w is not None:  # the plan's rung, once the worker serves its model
            planned = self.ladder.rungs[wp.rung]
            rung = wp.rung if planned.variant.name == w.serving[1] else self.ladder.index(w.serving[1])
        return next_frame_rung(
            self.ladder, rung, wp.batch if wp else 0, client.slo_ms, client.fps,
            client.window.estimate(now), client.rtt_ms, self.overhead.total_ms,
        )  # fmt: skip

    # requests --------------------------------------------------------------------------------
    async def dispatch(self, request: Request) -> Answer:
        clock = self.context.clock
        params = request.parameters
        if "client" not in params:
            raise InvalidRequestError(
                f"service {self.service.name!r} serves registered clients: parameters.client is missing"
            )
        client = self.client(params["client"])
        received = client.last_seen_s = clock.now()
        if "bandwidth_kbps" in params:
            self.report_bandwidth(client.id, params["bandwidth_kbps"])
        kbit = self._frame_kbit(params.get("frame_px"), client)
        attempts = 0
        while True:
            wp = self._worker_plan(client)
            w = self.workers.get(wp.worker) if wp else None
            if wp is None or w is None:
                return self._dropped(client, None, attempts, "unmapped", received)
            bw = client.window.estimate(clock.now())
            # The frame's own deadline charges only what is still to come after the worker: the
            # answer's way back (the way there and any pre-processing happen before the worker checks
            # it). The noise is a margin for *planning* (budgets, frame sizes); charged here too it
            # dropped frames that would have made their SLO whenever the machine was busy.
            deadline = server_deadline_s(
                received, client.slo_ms, kbit, bw, client.rtt_ms, self.overhead.dispatch_ms
            )
            deadline = min(deadline, request.deadline)
            if deadline - clock.now() <= 0:
                return self._dropped(client, w, attempts, "deadline", received)
            attempts += 1
            self.in_flight[w.member] += 1
            try:
                outcome = await self._attempt(w, request, f"{request.request_id}#{attempts}", deadline)
            finally:
                self.in_flight[w.member] -= 1
            if outcome is _LAZY_DROP:
                return self._dropped(client, w, attempts, "deadline", received)
            if outcome is _RETRY:
                continue
            return self._served(client, w, wp, outcome, attempts, received, kbit)

    async def _attempt(self, w: _Worker, request: Request, call_id: str, deadline: float) -> Any:
        """The outputs; _LAZY_DROP when the frame cannot make its deadline (the queue refused or
        dropped it, or no answer came in time); _RETRY once the worker's failure is handled (its
        server gone or its route moved off it: re-mapped; our switch target unloaded: back to the
        route's variant)."""
        app, variant = w.serving
        started = self.context.clock.now()
        result = await call_on_route(
            self.context,
            Target(w.server, app, variant),
            request.batch,
            call_id,
            deadline,
            Watch.leaves_server(w.member, w.server),
        )
        if result.status in (CallStatus.REFUSED, CallStatus.DEADLINE):
            return _LAZY_DROP  # dropped by the serving queue, refused by its admission, or late
        if result.status is CallStatus.MOVED:
            if not isinstance(result.error, ModelNotLoadedError):  # its server is gone or left it
                await self._worker_failed(w)
            elif variant != w.route_variant and w.serving == (app, variant):  # our rung was unloaded
                w.serving = (w.member, w.route_variant)
            elif w.serving == (app, variant):
                await self._worker_failed(w)
            return _RETRY
        call_ms = (self.context.clock.now() - started) * 1000.0
        compute_ms = float(self.ladder.latency_ms[self.ladder.index(variant), 0])
        self.dispatch_times.observe(self.context.clock.now(), max(call_ms - compute_ms, 0.0) / 2)
        self._track_overhead()
        return result.outputs

    def _track_overhead(self) -> None:
        """The overhead the budgets charge: the dispatch time as :class:`DispatchTimes` sees it now."""
        now = self.context.clock.now()
        self.overhead.dispatch_ms = self.dispatch_times.dispatch_ms(now)
        self.overhead.noise_ms = self.dispatch_times.noise_ms(now)

    async def _worker_failed(self, w: _Worker) -> None:
        """A request found ``w``'s server gone: leave it out until its route changes, re-map now."""
        route = self.context.routes.route(w.member)
        if route is not None and route.server == w.server:
            self.suspect[w.member] = route
        if self.workers.get(w.member) is w:
            del self.workers[w.member]
        await self.replan_now()

    def _served(
        self,
        client: SloClient,
        w: _Worker,
        wp: WorkerPlan,
        outputs: Any,
        attempts: int,
        received: float,
        kbit: float,
    ) -> Answer:
        variant = w.serving[1]
        j = self.ladder.index(variant)
        # A frame smaller than the variant's input is only as good as the variant that input is for
        # (the paper's accounting): the answer's accuracy is the lower of the two.
        sent = max(
            [i for i, r in enumerate(self.ladder.rungs) if r.frame_kbit <= kbit * (1 + 1e-9)], default=0
        )
        route = self.context.routes.route(w.member)
        return Answer(
            outputs=outputs,
            server=w.server,
            variant=variant,
            degraded=min(j, sent) < self.ladder.size - 1,
            accuracy=self.ladder.rungs[min(j, sent)].accuracy,
            kind=route.kind if route else "slo",
            attempts=attempts,
            detected_at=route.detected_at if route else None,
            route_at=route.route_at if route else None,
            extra=self._extra(client, w.member, received, batch=wp.batch),
        )

    def _dropped(
        self, client: SloClient, w: _Worker | None, attempts: int, reason: str, received: float
    ) -> Answer:
        return Answer(
            outputs=None,
            server="" if w is None else w.server,
            variant="" if w is None else w.serving[1],
            degraded=False,
            accuracy=0.0,
            kind="slo",
            attempts=attempts,
            dropped=True,
            extra=(*self._extra(client, None if w is None else w.member, received), ("drop_reason", reason)),
        )

    def _extra(
        self, client: SloClient, worker: str | None, received: float, batch: int = 0
    ) -> tuple[tuple[str, Any], ...]:
        now = self.context.clock.now()
        client.frame_rung = self._next_rung(client, now)
        return (
            ("client", client.id),
            ("worker", worker),
            ("batch", batch),
            ("residence_ms", round((now - received) * 1000.0, 3)),
            ("next_frame_px", self.ladder.rungs[client.frame_rung].px),
        )

    def _frame_kbit(self, frame_px: Any, client: SloClient) -> float:
        if frame_px is None:
            return self.ladder.rungs[client.frame_rung].frame_kbit
        if isinstance(frame_px, bool) or not isinstance(frame_px, int) or not 1 <= frame_px <= 8192:
            raise InvalidRequestError(f"parameters.frame_px must be an integer in 1..8192; got {frame_px!r}")
        return frame_kbit(frame_px)

    # state -----------------------------------------------------------------------------------
    def ready(self) -> bool:
        return any(self.context.routes.route(m) is not None for m in self.members)

    def describe(self) -> dict[str, Any]:
        ready = self.ready()
        mapped = {wp.worker: wp for wp in self.plan.workers} if self.plan else {}
        workers = {}
        for member in self.members:
            w = self.workers.get(member)
            wp = mapped.get(member)
            workers[member] = {
                "server": None if w is None else w.server,
                "variant": None if w is None else w.serving[1],
                "loading": None if w is None else w.loading,
                "planned": None if wp is None else self.ladder.rungs[wp.rung].name,
                "batch": 0 if wp is None else wp.batch,
                "clients": [] if wp is None else list(wp.clients),
            }
        return {
            "version": None,
            "state": "READY" if ready else "UNAVAILABLE",
            "reason": "" if ready else "no worker has a live server",
            "policy": self.params.policy,
            "clients": len(self.clients),
            "unmapped": [] if self.plan is None else list(self.plan.unserved),
            "replans": self.replans,
            "switches": self.switches,
            "overhead_ms": round(self.overhead.total_ms, 3),
            "variants": {r.name: r.px for r in self.ladder.rungs},
            "workers": workers,
        }


_RETRY = object()  # the worker failed under the request: re-mapped, try again
_LAZY_DROP = object()  # the serving queue dropped or refused it: it cannot make its deadline


def _family_of(service: Service, context: DispatchContext) -> Family:
    apps: Mapping[str, Any] = context.apps
    families = {apps[m].family for m in service.members if m in apps}
    if len(families) != 1 or len(apps) == 0:
        raise ConfigError(
            f"slo service {service.name!r}: its workers must be apps of one family; got {sorted(families)}"
        )
    (name,) = families
    family = context.families.get(name)
    if family is None:
        raise ConfigError(f"slo service {service.name!r}: no profiles for its family {name!r}")
    return family


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number; got {str(value)[:40]!r}")
    return float(value)
