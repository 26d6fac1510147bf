"""An LLM worker's Prometheus metrics, labelled by ``worker`` and ``model``.

The worker keeps its own registry and renders it as text on request
(:meth:`LlmWorker.metrics <failsoft.runtime.llm_worker.LlmWorker.metrics>`); whatever gateway
serves the LLM workers adds them to its ``/metrics`` as it adds agents
(:meth:`failsoft.runtime.gateway.fleet.FleetFigures.add_source` with the label ``worker``), for
the same reasons (one scrape target, a worker that does not answer is ``failsoft_llm_worker_up 0``).

* ``failsoft_llm_ttft_seconds``, ``failsoft_llm_tpot_seconds`` (histograms): each finished
  request's time to first token and time per output token (cancelled requests are left out);
* ``failsoft_llm_output_tokens_total``: tokens generated here; its rate is the worker's tokens/s;
* ``failsoft_llm_requests_total{reason}``: finished requests by why they ended (``length``,
  ``stop``, ``cancelled``);
* ``failsoft_llm_kv_pages_used``, ``failsoft_llm_kv_pages_total``; ``failsoft_llm_waiting``,
  ``failsoft_llm_running`` (requests queued for pages, and in the running batch);
* ``failsoft_llm_checkpoint_bytes``: peers' KV checkpoints held here (host memory), and
  ``failsoft_llm_checkpoint_exported_bytes_total``: KV pages this worker shipped as checkpoints;
* ``failsoft_llm_load_seconds``: the model's last load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

# read at scrape time: the worker's load() (pages, queue, held checkpoints) and its load_ms
Snapshot = Callable[[], dict[str, Any]]


class LlmWorkerMetrics:
    """One worker's registry; ``snapshot`` is read at each scrape."""

    def __init__(self, worker: str, model: str, snapshot: Snapshot) -> None:
        self.labels = (worker, model)
        r = self.registry = CollectorRegistry()
        names = ["worker", "model"]
        self.ttft = Histogram(
            "failsoft_llm_ttft_seconds", "Time to first token", names, buckets=TTFT_BUCKETS, registry=r
        ).labels(*self.labels)
        self.tpot = Histogram(
            "failsoft_llm_tpot_seconds", "Time per output token", names, buckets=TPOT_BUCKETS, registry=r
        ).labels(*self.labels)
        self.tokens = Counter("failsoft_llm_output_tokens", "Tokens generated", names, registry=r).labels(
            *self.labels
        )
        self._requests = Counter("failsoft_llm_requests", "Finished requests", [*names, "reason"], registry=r)
        self.exported = Counter(
            "failsoft_llm_checkpoint_exported_bytes",
            "KV checkpoint bytes shipped to peers",
            names,
            registry=r,
        ).labels(*self.labels)
        r.register(_Live(self.labels, snapshot))

    def finished(self, reason: str, ttft_ms: float | None, tpot_ms: float | None) -> None:
        """A request ended; its TTFT and TPOT count unless it was cancelled."""
        self._requests.labels(*self.labels, reason or "-").inc()
        if reason == "cancelled":
            return
        if ttft_ms is not None:
            self.ttft.observe(ttft_ms / 1000.0)
        if tpot_ms is not None:
            self.tpot.observe(tpot_ms / 1000.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Live(Collector):
    def __init__(self, labels: tuple[str, str], snapshot: Snapshot) -> None:
        self.labels, self.snapshot = labels, snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot()
        figures = (
            ("failsoft_llm_kv_pages_used", "KV pages in use", snap.get("pages_used")),
            ("failsoft_llm_kv_pages_total", "KV pages of the pool", snap.get("pages_total")),
            ("failsoft_llm_waiting", "Requests waiting for KV pages", snap.get("waiting")),
            ("failsoft_llm_running", "Requests in the running batch", snap.get("running")),
            ("failsoft_llm_checkpoint_bytes", "Peers' KV checkpoints held here", snap.get("held_kv_bytes")),
            ("failsoft_llm_load_seconds", "The model's last load", snap.get("load_s")),
        )
        for name, text, value in figures:
            family = GaugeMetricFamily(name, text, labels=["worker", "model"])
            if value is not None:
                family.add_metric(list(self.labels), float(value))
            yield family
