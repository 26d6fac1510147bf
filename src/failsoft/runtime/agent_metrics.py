"""An agent's Prometheus metrics, per loaded model, labelled by ``server``; the gateway serves them.

**How they reach ``/metrics``.** Each agent keeps its own registry (prometheus_client) and renders
it as Prometheus text on request (:meth:`Agent.metrics <failsoft.runtime.agent.Agent.metrics>`).
The gateway asks every agent for it when it is scraped and serves the figures beside its own
(:mod:`failsoft.runtime.gateway.fleet`). Not Ray's metrics export: that needs Ray's metrics agent
and dashboard processes on every node and a Prometheus that discovers them (through a file Ray
writes on the head node), figures then come late by Ray's export interval, and a failsoft run in
cluster mode would need both; with the gateway pulling, one scrape target holds the whole fleet, an
agent that does not answer is seen at once (``failsoft_agent_up 0``), and nothing else listens.

Per model (labels ``server``, ``app``, ``variant``):

* ``failsoft_agent_queue_depth``: requests waiting in the model's serving queue, now;
* ``failsoft_agent_queue_wait_seconds`` (histogram): each request's wait before its batch ran;
* ``failsoft_agent_batch_size`` (histogram): rows per batch run;
* ``failsoft_agent_inference_seconds`` (histogram): each batch's predict;
* ``failsoft_agent_queue_requests_total{outcome}``: served, refused, dropped, cancelled, expired,
  failed (the queue's own counters);
* ``failsoft_agent_model_memory_bytes``: the model's profiled memory (what the server's budget counts);
* ``failsoft_agent_load_seconds`` (histogram, labels ``server``, ``family``, ``variant``): loads,
  from the disk to a warm model.

Per server: ``failsoft_agent_resident_memory_bytes`` (the agent process's RSS),
``failsoft_agent_device_memory_bytes{kind}`` on a GPU (``free``, ``total`` of the device, the
``process``'s own use, context included, ``torch_reserved``), ``failsoft_agent_memory_budget_bytes``
and ``failsoft_agent_memory_accounted_bytes`` (the config's ``memory_mb`` and what is held against it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from failsoft.runtime.serving import BatchDone

WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
INFERENCE_BUCKETS = WAIT_BUCKETS
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MB = 2**20
OUTCOMES = ("served", "refused", "dropped", "cancelled", "expired", "failed")

# what the collector reads from the agent at each scrape: its queue_stats(), memory and device report
Snapshot = Callable[[], dict[str, Any]]


class AgentMetrics:
    """The registry of one agent (``server``). ``snapshot`` returns, at scrape time, the queues'
    stats by ``app/variant``, the memory budget and what is accounted, and the device's memory."""

    def __init__(self, server: str, snapshot: Snapshot) -> None:
        self.server = server
        r = self.registry = CollectorRegistry()
        labels = ["server", "app", "variant"]
        self.wait = Histogram(
            "failsoft_agent_queue_wait_seconds",
            "Time a request waited in its model's serving queue before its batch ran",
            labels,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.batch = Histogram(
            "failsoft_agent_batch_size", "Rows per batch run", labels, buckets=BATCH_BUCKETS, registry=r
        )
        self.inference = Histogram(
            "failsoft_agent_inference_seconds",
            "Time of each batch's predict",
            labels,
            buckets=INFERENCE_BUCKETS,
            registry=r,
        )
        self.load = Histogram(
            "failsoft_agent_load_seconds",
            "Model loads, from the disk to a warm model",
            ["server", "family", "variant"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        r.register(_Live(server, snapshot))

    def batch_observer(self, app: str, variant: str) -> Callable[[BatchDone], None]:
        """What a serving queue calls after each batch (in its worker thread)."""
        wait = self.wait.labels(self.server, app, variant)
        batch = self.batch.labels(self.server, app, variant)
        inference = self.inference.labels(self.server, app, variant)

        def observe(done: BatchDone) -> None:
            batch.observe(done.rows)
            inference.observe(done.predict_s)
            for waited in done.waits_s:
                wait.observe(waited)

        return observe

    def loaded(self, family: str, variant: str, seconds: float) -> None:
        self.load.labels(self.server, family, variant).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Live(Collector):
    """The figures read at scrape time: queue depths and counters, memory."""

    def __init__(self, server: str, snapshot: Snapshot) -> None:
        self.server, self.snapshot = server, snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self.snapshot()
        labels = ["server", "app", "variant"]
        depth = GaugeMetricFamily(
            "failsoft_agent_queue_depth", "Requests waiting in the queue", labels=labels
        )
        memory = GaugeMetricFamily(
            "failsoft_agent_model_memory_bytes", "Profiled memory of a loaded model", labels=labels
        )
        outcomes = CounterMetricFamily(
            "failsoft_agent_queue_requests",
            "Requests by how the queue ended them",
            labels=[*labels, "outcome"],
        )
        for key, stats in snap.get("queues", {}).items():
            app, variant = key.split("/", 1)
            depth.add_metric([self.server, app, variant], float(stats.get("queued", 0)))
            for outcome in OUTCOMES:
                outcomes.add_metric([self.server, app, variant, outcome], float(stats.get(outcome, 0)))
        for (app, variant), mb in snap.get("models_mb", {}).items():
            memory.add_metric([self.server, app, variant], mb * MB)
        yield from (depth, outcomes, memory)
        yield from self._memory(snap)

    def _memory(self, snap: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, text: str, value: float | None) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, text, labels=["server"])
            if value is not None:
                family.add_metric([self.server], value)
            return family

        yield gauge("failsoft_agent_resident_memory_bytes", "The agent process's RSS", snap.get("rss_bytes"))
        yield gauge(
            "failsoft_agent_memory_budget_bytes", "The server's memory_mb", snap.get("budget_mb", 0) * MB
        )
        yield gauge(
            "failsoft_agent_memory_accounted_bytes",
            "Profiled memory of what the server holds or is releasing",
            snap.get("accounted_mb", 0) * MB,
        )
        device = GaugeMetricFamily(
            "failsoft_agent_device_memory_bytes",
            "GPU memory as the device reports it",
            labels=["server", "kind"],
        )
        dev = snap.get("device") or {}
        if dev.get("cuda"):
            for kind in ("free", "total", "process", "torch_reserved"):
                value = dev.get(f"{kind}_mb")
                if value is not None:
                    device.add_metric([self.server, kind], float(value) * MB)
        yield device
