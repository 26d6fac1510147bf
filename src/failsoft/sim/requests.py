"""The request-level core: arrivals, client queueing, batching and service times from profiles.

Each simulated app has a client issuing requests as a Poisson process at the app's ``rate_rps``.
The client sends each request to the server it believes serves the app; there, the app's loaded
model instance has a serving queue run by the *runtime's* queue discipline
(:mod:`failsoft.policies.queueing`, by name from the registry: ``SimConfig.discipline``): admission
(a bounded queue, ``max_queue``, refuses what it cannot finish in time), batches of up to
``max_batch`` rows, lazy drops. A batch takes the variant's measured batch latency
(:meth:`~failsoft.domain.Variant.latency_at`; without a batch profile, the batch-1 ``latency_ms``
times ``1 + batch_cost * (b - 1)``). A request's deadline is when its client gives up
(``request_timeout_ms`` after it was first issued); by default clients never give up, as FailLite's
wait through an outage, and no request is dropped. Instances on one server do not slow each other
down: the policies keep each server's compute demand (``rate * latency``) within its capacity, and
the profiles carry no interference measurements.

Failures, as FailLite's clients see them (5.2): requests sent to, queued at or in service on a
crashed server are lost and wait at the client, together with new ones, until the controller
notifies it of the new location; then they are reissued (their latency counts from the first
issue). During a progressive upgrade the server switches the app's instance in place (the client
is not told): queued requests move to the new instance, a batch in service completes on the old.

Per-request records give latency percentiles, SLO misses (late, dropped or never served) and the
share served by a smaller variant than the primary: the measurements later mechanisms (tail
latency, SLO misses) build on. Which apps get a request-level simulation is ``SimConfig.requests``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from failsoft.domain import Scenario, Variant
from failsoft.policies.queueing import Queued, QueueDiscipline, ServiceModel
from failsoft.policies.registry import make as make_policy
from failsoft.sim.config import SimConfig


@dataclass(slots=True)
class Request:
    app: str
    issued_at: float
    done_at: float | None = None
    variant: str | None = None
    deadline_s: float = math.inf  # when its client gives up
    dropped: bool = False  # refused or dropped by a serving queue: its client got an error


@dataclass
class RequestStats:
    """Per-request outcomes of one event: latencies (ms) of the served, counts of the rest."""

    latencies_ms: list[float] = field(default_factory=list)
    late: int = 0  # served after the app's SLO
    unserved: int = 0  # never served before the simulation ended (dropped ones apart)
    dropped: int = 0  # refused or dropped by a serving queue (only with deadlines or a bound)
    degraded: int = 0  # served by a variant other than the primary's

    @property
    def total(self) -> int:
        return len(self.latencies_ms) + self.unserved + self.dropped

    @staticmethod
    def pooled(stats: Sequence[RequestStats]) -> dict[str, float]:
        if not stats:
            return {}
        latencies = np.array([x for s in stats for x in s.latencies_ms])
        total = sum(s.total for s in stats)
        served = len(latencies)

        def pct(q: float) -> float:
            return float(np.percentile(latencies, q)) if served else float("nan")

        return {
            "requests": float(total),
            "req_p50_ms": pct(50),
            "req_p99_ms": pct(99),
            "req_unserved": float(sum(s.unserved for s in stats)),
            "req_dropped": float(sum(s.dropped for s in stats)),
            "req_slo_miss_pct": (
                100.0 * sum(s.late + s.unserved + s.dropped for s in stats) / total if total else 0.0
            ),
            "req_degraded_pct": 100.0 * sum(s.degraded for s in stats) / served if served else 0.0,
        }


class _Instance:
    """One model loaded for one app on one server: a serving queue and its batching worker."""

    def __init__(self, core: RequestCore, app: str, server: str, variant: Variant) -> None:
        self.core, self.app, self.server, self.variant = core, app, server, variant
        self.service = ServiceModel(variant, core.config.batch_cost)
        self.queue: list[Queued] = []  # arrival order; each item's key is its Request
        self.batch: list[Request] = []
        self.busy_until = 0.0
        self.retired = False
        self.started = False
        self.wakeup: simpy.Event | None = None
        self.handoff: Callable[[list[Request]], None] = core.client_pending
        self.process = core.env.process(self.run())

    def put(self, request: Request) -> None:
        now = self.core.env.now
        item = Queued(request, now, request.deadline_s)
        bounded = request.deadline_s < math.inf or self.core.config.max_queue is not None
        if (
            bounded
            and not self.core.discipline.admit(self.queue, item, now, self.busy_until, self.service).admitted
        ):
            request.dropped = True  # the runtime answers 503; the client does not retry by itself
            return
        self.queue.append(item)
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        env, discipline = self.core.env, self.core.discipline
        self.started = True
        while not self.retired:
            if not self.queue:
                self.wakeup = env.event()
                try:
                    yield self.wakeup
                except simpy.Interrupt:
                    return  # stopped: stop() handed the queue over
                continue
            decision = discipline.next_batch(self.queue, env.now, self.service)
            if len(decision.run) + len(decision.drop) == len(self.queue):
                self.queue = []  # the whole queue taken (the usual case): nothing to filter
            else:
                taken = {id(item) for item in decision.run + decision.drop}
                self.queue = [item for item in self.queue if id(item) not in taken]
            for item in decision.drop:
                item.key.dropped = True
            if not decision.run:
                continue
            self.batch = [item.key for item in decision.run]
            service_s = self.service.batch_s(decision.rows)
            self.busy_until = env.now + service_s
            try:
                yield env.timeout(service_s)
            except simpy.Interrupt:
                return  # crashed: the batch was handed to the client by stop()
            for request in self.batch:
                request.done_at, request.variant = env.now, self.variant.name
            self.batch = []

    def put_all(self, requests: list[Request]) -> None:
        for request in requests:
            self.put(request)

    def stop(self, handoff: Callable[[list[Request]], None], crashed: bool) -> None:
        """Stop serving: queued requests (and, on a crash, the batch in service) go to ``handoff``."""
        self.retired, self.handoff = True, handoff
        queued = [item.key for item in self.queue]
        self.queue = []
        lost = (self.batch if crashed else []) + queued
        if self.started and (crashed or not self.batch):
            self.process.interrupt()  # an unstarted worker sees ``retired`` and exits at once
        handoff(lost)


class RequestCore:
    """Clients and model instances of the apps that get a request-level simulation."""

    def __init__(
        self, env: simpy.Environment, scenario: Scenario, apps: Iterable[str], config: SimConfig, seed: str
    ) -> None:
        self.env, self.scenario, self.config, self.seed = env, scenario, config, seed
        self.discipline: QueueDiscipline = make_policy(
            "queueing", config.discipline, config.max_batch, config.max_queue
        )
        self.apps = set(apps)
        self.route: dict[str, str] = {}  # app -> server its client sends to
        self.pending: dict[str, list[Request]] = {a: [] for a in self.apps}
        self.instances: dict[tuple[str, str], _Instance] = {}  # (server, app) -> serving instance
        self.dead: set[str] = set()
        self.issued: list[Request] = []
        for name in sorted(self.apps):
            app = scenario.app(name)
            assert app.primary is not None
            self.route[name] = app.primary.server
            self.serve(name, app.primary.server, scenario.primary_variant(app))

    def start(self, start_s: float, end_s: float) -> list[simpy.Process]:
        return [self.env.process(self._arrivals(a, start_s, end_s)) for a in sorted(self.apps)]

    def _arrivals(self, name: str, start_s: float, end_s: float) -> Generator[simpy.Event, Any, None]:
        rate = self.scenario.app(name).rate_rps
        timeout_ms = self.config.request_timeout_ms
        rng = random.Random(f"{self.seed}/requests/{name}")
        t = start_s + rng.expovariate(rate)
        while t < end_s:
            yield self.env.timeout(t - self.env.now)
            deadline = math.inf if timeout_ms is None else self.env.now + timeout_ms / 1000.0
            request = Request(name, self.env.now, deadline_s=deadline)
            self.issued.append(request)
            self._send(request)
            t += rng.expovariate(rate)

    def _send(self, request: Request) -> None:
        server = self.route[request.app]
        instance = self.instances.get((server, request.app))
        if instance is None or server in self.dead:
            self.pending[request.app].append(request)
        else:
            instance.put(request)

    def client_pending(self, requests: list[Request]) -> None:
        for request in requests:
            self.pending[request.app].append(request)

    # hooks called by the controller ----------------------------------------------------------
    def serve(self, app: str, server: str, variant: Variant) -> None:
        """``server`` now serves ``app`` with ``variant`` (a new load, a warm switch or an upgrade)."""
        if app not in self.apps:
            return
        new = _Instance(self, app, server, variant)
        old = self.instances.get((server, app))
        self.instances[(server, app)] = new
        if old is not None:
            old.stop(new.put_all, crashed=False)
        if self.route[app] == server:
            self._flush(app)

    def notify(self, app: str, server: str) -> None:
        """The client of ``app`` learns its new location and reissues what it holds."""
        if app not in self.apps:
            return
        self.route[app] = server
        self._flush(app)

    def crash(self, server: str) -> None:
        self.dead.add(server)
        for where, app in [k for k in self.instances if k[0] == server]:
            self.lose(app, where)

    def lose(self, app: str, server: str) -> None:
        """``server`` lives on but no longer holds ``app``'s model: its instance stops as in a crash
        (the batch in service and the queue go back to the client, which holds them, and what it
        sends meanwhile, until the model serves again there or elsewhere)."""
        instance = self.instances.pop((server, app), None)
        if instance is not None:
            instance.stop(self.client_pending, crashed=True)

    def _flush(self, app: str) -> None:
        held, self.pending[app] = self.pending[app], []
        for request in held:
            self._send(request)

    def stats(self) -> RequestStats:
        stats = RequestStats()
        for request in self.issued:
            app = self.scenario.app(request.app)
            if request.dropped:
                stats.dropped += 1
                continue
            if request.done_at is None:
                stats.unserved += 1
                continue
            latency = (request.done_at - request.issued_at) * 1000.0
            stats.latencies_ms.append(latency)
            stats.late += app.slo_ms is not None and latency > app.slo_ms
            stats.degraded += app.primary is not None and request.variant != app.primary.variant
        return stats
