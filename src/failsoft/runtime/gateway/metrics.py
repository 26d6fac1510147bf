"""Prometheus metrics of the gateway, in base units (seconds), on ``GET /metrics``.

* ``failsoft_requests_total{app, variant, code}``: every infer request by the HTTP status it got
  (``app`` is the service named in the URL, ``-`` for a name the gateway does not serve; ``code``
  499 when the client left before the answer), and ``failsoft_request_latency_seconds{app, variant}``;
* ``failsoft_request_retries_total{app}``: requests moved to a newer route (a failover under them);
* ``failsoft_server_failures_total{server}``, ``failsoft_failovers_total{app, kind}``,
  ``failsoft_upgrades_total{app}``, ``failsoft_restores_total{app}``;
* ``failsoft_mttr_seconds{kind}``: FailLite's MTTR (5.1), from a failure's detection to the new
  route published, load time included (the ``failover`` event's ``route_ms``);
* ``failsoft_recoveries_total{app}`` and ``failsoft_first_answer_seconds{kind}``: an app recovered
  when it answers again on a new route after a failure; detection to that first answer;
* ``failsoft_app_replicas{app}`` (the routes serving it now: its route and loaded replicas) and
  ``failsoft_app_ongoing_requests{app}`` (its requests in flight at this gateway, what autoscaling
  reads), read when scraped;
* ``failsoft_route_version``, ``failsoft_controller_connected`` (0 while a stream to the controller
  fails) and ``failsoft_controller_step_seconds{step, stat}`` (the control loop's step durations,
  read from the controller).

``/admin/recoveries`` lists the last :data:`RECOVERY_LOG_SIZE` recoveries, and as many requests
that left a dead server for their next route (``moves``: :class:`~failsoft.runtime.gateway.dispatch.Move`,
times in wall-clock seconds); what the gateway
remembers to count each failure and recovery once is one entry per server and per app, so nothing
here grows with uptime.

Each gateway has its own registry, so several can live in one process (tests).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from failsoft.runtime.gateway.dispatch import Answer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MTTR_BUCKETS = (0.001, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RECOVERY_LOG_SIZE = 1000
MAX_CACHED_CHILDREN = 4096


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


class _AppLoad(Collector):
    """Per app, read when scraped: (routes serving it, requests in flight)."""

    def __init__(self, read: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        replicas = GaugeMetricFamily("failsoft_app_replicas", "Routes serving the app now", labels=["app"])
        ongoing = GaugeMetricFamily(
            "failsoft_app_ongoing_requests", "Requests in flight at this gateway", labels=["app"]
        )
        for app, (serving, in_flight) in sorted(self.read().items()):
            replicas.add_metric([app], float(serving))
            ongoing.add_metric([app], float(in_flight))
        yield replicas
        yield ongoing


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "failsoft_requests", "Inference requests by status code", ["app", "variant", "code"], registry=r
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
            "MTTR (FailLite): failure detection to the new route published, load time included",
            ["kind"],
            buckets=MTTR_BUCKETS,
            registry=r,
        )
        self.first_answer = Histogram(
            "failsoft_first_answer_seconds",
            "Failure detection to the first answer on the new route",
            ["kind"],
            buckets=MTTR_BUCKETS,
            registry=r,
        )
        self.route_version = Gauge("failsoft_route_version", "Routing table version", registry=r)
        self.connected = Gauge(
            "failsoft_controller_connected", "1 while every stream to the controller answers", registry=r
        )
        self.steps = _ControllerSteps()
        r.register(self.steps)
        self.recovery_log: deque[dict[str, Any]] = deque(maxlen=RECOVERY_LOG_SIZE)
        self.move_log: deque[dict[str, Any]] = deque(maxlen=RECOVERY_LOG_SIZE)
        # detection time of the last recovery (per app) and failure (per server) counted
        self._recovered: dict[str, float] = {}
        self._failed: dict[str, float] = {}
        # observe's metric children by their labels (prometheus_client's labels() validates and
        # locks on every call)
        self._counted: dict[tuple[str, str, int], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    def watch_apps(self, read: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        """Export ``read()``'s (replicas, ongoing requests) per app at every scrape."""
        self.registry.register(_AppLoad(read))

    def observe(self, app: str, code: int, seconds: float, answer: Answer | None) -> None:
        variant = answer.variant if answer else "-"
        _child(self._counted, (app, variant, code), self.requests, (app, variant, str(code))).inc()
        if answer is None:
            return
        _child(self._timed, (app, variant), self.latency, (app, variant)).observe(seconds)
        if answer.attempts > 1:
            self.retries.labels(app).inc()
        if answer.detected_at is not None and answer.detected_at > self._recovered.get(app, -math.inf):
            self._recovered[app] = answer.detected_at
            self._recovery(app, answer, time.time())

    def _recovery(self, app: str, answer: Answer, answered_at: float) -> None:
        detected_at = answer.detected_at or answered_at
        first = max(answered_at - detected_at, 0.0)
        self.recoveries.labels(app).inc()
        self.first_answer.labels(answer.kind).observe(first)
        self.recovery_log.append(
            {
                "app": app,
                "server": answer.server,
                "variant": answer.variant,
                "kind": answer.kind,
                "detected_at": detected_at,
                "mttr_ms": None if answer.route_at is None else (answer.route_at - detected_at) * 1000,
                "first_answer_ms": first * 1000.0,
                "answered_at": answered_at,
            }
        )

    def on_event(self, event: dict[str, Any]) -> None:
        kind, app = event.get("type"), event.get("app")
        if kind == "failure" and event.get("server"):
            server = event["server"]
            detected = float(event.get("detected_at") or event.get("timestamp") or time.time())
            if detected > self._failed.get(server, -math.inf):  # once per failure, replays ignored
                self._failed[server] = detected
                self.failures.labels(server).inc()
        elif kind == "failover" and app:
            self.failovers.labels(app, event.get("kind", "?")).inc()
            if event.get("route_ms") is not None:
                self.mttr.labels(event.get("kind", "?")).observe(max(float(event["route_ms"]) / 1000, 0.0))
        elif kind == "upgrade" and app:
            self.upgrades.labels(app).inc()
        elif kind == "restore" and app:
            self.restores.labels(app).inc()

    def render(self, route_version: int, connected: bool, controller_stats: dict[str, Any] | None) -> bytes:
        self.route_version.set(route_version)
        self.connected.set(1 if connected else 0)
        if controller_stats is not None:
            self.steps.stats = controller_stats
        return generate_latest(self.registry)


def _child(cache: dict[Any, Any], key: Any, metric: Any, labels: tuple[str, ...]) -> Any:
    child = cache.get(key)
    if child is None:
        child = metric.labels(*labels)
        if len(cache) < MAX_CACHED_CHILDREN:  # bounded whatever the labels
            cache[key] = child
    return child


def first_recoveries(log: list[dict[str, Any]], since: float) -> dict[str, dict[str, Any]]:
    """Each app's first recovery detected at or after ``since`` (wall clock), from the recovery log.

    The first, not the last: an app failed over twice (its stand-in lost too) keeps the record of
    the failure a report asks about."""
    first: dict[str, dict[str, Any]] = {}
    for rec in sorted(log, key=lambda r: r["detected_at"]):
        if rec["detected_at"] >= since:
            first.setdefault(rec["app"], rec)
    return first
