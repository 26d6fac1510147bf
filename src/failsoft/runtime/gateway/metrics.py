"""Prometheus metrics of the gateway, in base units (seconds), on ``GET /metrics``.

* ``failsoft_requests_total{app, variant, code}`` and ``failsoft_request_latency_seconds{app, variant}``;
* ``failsoft_request_retries_total{app}``: requests moved to a newer route (a failover under them);
* ``failsoft_server_failures_total{server}``, ``failsoft_failovers_total{app, kind}``,
  ``failsoft_upgrades_total{app}``, ``failsoft_restores_total{app}``;
* ``failsoft_recoveries_total{app}`` and ``failsoft_mttr_seconds{kind}``: an app recovered when it
  answers again on a new route after a failure; its MTTR as FailLite defines it (5.1) runs from the
  failure's detection to that first answer, load time included;
* ``failsoft_route_version`` and ``failsoft_controller_step_seconds{step, stat}`` (the control
  loop's step durations, read from the controller).

Each gateway has its own registry, so several can live in one process (tests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from failsoft.runtime.gateway.router import Answer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MTTR_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _ControllerSteps(Collector):
    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "failsoft_controller_step_seconds", "Control-loop step durations", labels=["step", "stat"]
        )
        for step, s in self.stats.get("steps", {}).items():
            for stat in ("last_s", "max_s", "total_s"):
                family.add_metric([step, stat.removesuffix("_s")], float(s[stat]))
        yield family


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "failsoft_requests", "Inference requests", ["app", "variant", "code"], registry=r
        )
        self.latency = Histogram(
            "failsoft_request_latency_seconds",
            "Inference latency seen by the gateway",
            ["app", "variant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "failsoft_request_retries", "Requests moved to a newer route", ["app"], registry=r
        )
        self.failures = Counter(
            "failsoft_server_failures", "Server failures detected", ["server"], registry=r
        )
        self.failovers = Counter("failsoft_failovers", "Apps failed over", ["app", "kind"], registry=r)
        self.upgrades = Counter("failsoft_upgrades", "Progressive upgrades done", ["app"], registry=r)
        self.restores = Counter("failsoft_restores", "Apps returned to their primary", ["app"], registry=r)
        self.recoveries = Counter(
            "failsoft_recoveries", "Apps answering again after a failure", ["app"], registry=r
        )
        self.mttr = Histogram(
            "failsoft_mttr_seconds",
            "Failure detection to first answer on the new route",
            ["kind"],
            buckets=MTTR_BUCKETS,
            registry=r,
        )
        self.route_version = Gauge("failsoft_route_version", "Routing table version", registry=r)
        self.steps = _ControllerSteps()
        r.register(self.steps)
        self.recovery_log: list[dict[str, Any]] = []
        self._seen_recoveries: set[tuple[str, float]] = set()
        self._seen_failures: set[tuple[str, float]] = set()

    def observe(self, app: str, code: int, seconds: float, answer: Answer | None) -> None:
        variant = answer.route.variant if answer else "-"
        self.requests.labels(app, variant, str(code)).inc()
        if answer is None:
            return
        self.latency.labels(app, variant).observe(seconds)
        if answer.attempts > 1:
            self.retries.labels(app).inc()
        route = answer.route
        if route.detected_at is not None and (app, route.detected_at) not in self._seen_recoveries:
            self._seen_recoveries.add((app, route.detected_at))
            mttr = answer.answered_at - route.detected_at
            self.recoveries.labels(app).inc()
            self.mttr.labels(route.kind).observe(max(mttr, 0.0))
            self.recovery_log.append(
                {
                    "app": app,
                    "server": route.server,
                    "variant": route.variant,
                    "kind": route.kind,
                    "detected_at": route.detected_at,
                    "route_ms": None
                    if route.route_at is None
                    else (route.route_at - route.detected_at) * 1000,
                    "mttr_ms": mttr * 1000.0,
                    "answered_at": answer.answered_at,
                }
            )

    def on_event(self, event: dict[str, Any]) -> None:
        kind, app = event.get("type"), event.get("app")
        if kind == "failure" and event.get("server"):
            key = (event["server"], float(event.get("detected_at") or event.get("timestamp") or time.time()))
            if key not in self._seen_failures:
                self._seen_failures.add(key)
                self.failures.labels(event["server"]).inc()
        elif kind == "failover" and app:
            self.failovers.labels(app, event.get("kind", "?")).inc()
        elif kind == "upgrade" and app:
            self.upgrades.labels(app).inc()
        elif kind == "restore" and app:
            self.restores.labels(app).inc()

    def render(self, route_version: int, controller_stats: dict[str, Any] | None) -> bytes:
        self.route_version.set(route_version)
        if controller_stats is not None:
            self.steps.stats = controller_stats
        return generate_latest(self.registry)
