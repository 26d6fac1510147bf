"""An app's load ramping up and down, its replicas autoscaled: simulated over the orchestration core.

The runtime scales an app like this: the gateway counts the app's requests in flight and reports
them to the controller every 250 ms, the controller feeds them to the orchestration core
(:meth:`~failsoft.orchestration.Orchestrator.observe_ongoing`), whose autoscaler (Ray Serve's rule,
:mod:`failsoft.policies.autoscale`) changes the replica count, and the core loads or drains
replicas; the gateway picks a replica per request by the power of two choices
(:mod:`failsoft.policies.replica_routing`). This experiment runs the same core, autoscaler and
choice on SimPy time:

* requests arrive as a Poisson process whose rate follows a :class:`Ramp` (base, linear up to the
  peak, held, linear down, base again);
* each goes to one of the app's serving copies (its route and loaded replicas, read from the core's
  state as the gateway reads the published table), chosen by the power of two choices on the
  requests in flight on each, and waits for that server (one request at a time, the variant's
  profiled ``latency_ms``);
* every ``report_s`` the requests in flight are fed to the core; a ``Load`` takes the variant's
  profiled ``load_ms``, an ``Unload`` is immediate.

What it leaves out: batching, the gateway's own overheads and the long-poll's delay (microseconds
to a millisecond in the runtime), failures.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from failsoft.domain import Scenario
from failsoft.orchestration import (
    ClusterState,
    Command,
    Emit,
    Load,
    OrchestrationSettings,
    Orchestrator,
    Publish,
    Unload,
)
from failsoft.policies.replica_routing import power_of_two

Process = Generator[simpy.Event, Any, None]


@dataclass(frozen=True, slots=True)
class Ramp:
    """Request rate over time: ``base_rps`` for ``lead_s``, up to ``peak_rps`` over ``up_s``, held
    ``hold_s``, down over ``down_s``, then ``base_rps`` for ``tail_s``."""

    base_rps: float
    peak_rps: float
    lead_s: float = 2.0
    up_s: float = 5.0
    hold_s: float = 10.0
    down_s: float = 5.0
    tail_s: float = 15.0

    @property
    def duration_s(self) -> float:
        return self.lead_s + self.up_s + self.hold_s + self.down_s + self.tail_s

    def rate(self, t: float) -> float:
        up_at = self.lead_s
        peak_at = up_at + self.up_s
        down_at = peak_at + self.hold_s
        base_at = down_at + self.down_s
        if t < up_at or t >= base_at:
            return self.base_rps
        if t < peak_at:
            return self.base_rps + (self.peak_rps - self.base_rps) * (t - up_at) / self.up_s
        if t < down_at:
            return self.peak_rps
        return self.peak_rps - (self.peak_rps - self.base_rps) * (t - down_at) / self.down_s


@dataclass
class AutoscaleRun:
    """What happened: replicas serving over time, the scale events, and every request's latency."""

    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, serving, ongoing)
    events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[float, float, str]] = field(default_factory=list)  # (sent, latency_s, server)

    def p99_ms(self, start: float, end: float) -> float | None:
        lat = [s for t, s, _ in self.requests if start <= t < end]
        return None if not lat else float(np.percentile(lat, 99) * 1000.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": [{"t": round(t, 3), "serving": n, "ongoing": o} for t, n, o in self.timeline],
            "scale_events": self.events,
            "requests": len(self.requests),
            "max_replicas": max((n for _, n, _ in self.timeline), default=0),
        }


class AutoscaleSim:
    """One app under a :class:`Ramp`, its replicas autoscaled by the core; see the module docstring."""

    def __init__(self, scenario: Scenario, app: str, ramp: Ramp, seed: int = 0, report_s: float = 0.25):
        self.env = simpy.Environment()
        self.app, self.ramp, self.report_s = app, ramp, report_s
        self.state = ClusterState.deployed(scenario)
        settings = OrchestrationSettings(replan_warm=False, reconcile_s=None, gc_s=None, drain_s=0.2)
        self.core = Orchestrator(self.state, settings, 0.0)
        self.queues = {s.name: simpy.Resource(self.env, capacity=1) for s in scenario.servers}
        self.in_flight: dict[str, int] = {}
        self.ongoing = 0
        self.rng = random.Random(seed)
        self.p2c = random.Random(f"p2c:{app}")
        self.run = AutoscaleRun()
        self._run(self.core.assume_deployed(0.0))

    def simulate(self) -> AutoscaleRun:
        self.env.process(self._arrivals())
        self.env.process(self._reports())
        self.env.run(until=self.ramp.duration_s)
        return self.run

    # the core's commands ------------------------------------------------------------------------
    def _run(self, commands: list[Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, Load):
                self.env.process(self._load(cmd))
            elif isinstance(cmd, Emit) and cmd.type == "scale":
                self.run.events.append({"t": round(self.env.now, 3), **cmd.fields})
            elif not isinstance(cmd, (Emit, Unload, Publish)):
                raise RuntimeError(f"the autoscale simulation does not carry out {type(cmd).__name__}")

    def _load(self, cmd: Load) -> Process:
        yield self.env.timeout(self.state.variant(cmd.app, cmd.variant).load_ms / 1000.0)
        self._run(self.core.load_done(cmd.load_id, True, self.env.now))

    # requests -------------------------------------------------------------------------------------
    def _reports(self) -> Process:
        while True:
            yield self.env.timeout(self.report_s)
            self._run(self.core.observe_ongoing(self.app, self.ongoing, self.env.now))
            serving = len(self.state.serving(self.app))
            self.run.timeline.append((self.env.now, serving, self.ongoing))

    def _arrivals(self) -> Process:
        while True:
            rate = max(self.ramp.rate(self.env.now), 1e-6)
            yield self.env.timeout(self.rng.expovariate(rate))
            self.env.process(self._request())

    def _request(self) -> Process:
        serving = self.state.serving(self.app)
        server = power_of_two([p.server for p in serving], self.in_flight, self.p2c)
        variant = self.state.variant(self.app, next(p.variant for p in serving if p.server == server))
        sent = self.env.now
        self.ongoing += 1
        self.in_flight[server] = self.in_flight.get(server, 0) + 1
        with self.queues[server].request() as turn:
            yield turn
            yield self.env.timeout(variant.latency_ms / 1000.0)
        self.in_flight[server] -= 1
        self.ongoing -= 1
        self.run.requests.append((sent, self.env.now - sent, server))
