"""The Grafana dashboards read metrics that exist, and the LLM worker's figures are what it did.

``deploy/grafana/failsoft.json`` (gateway and agents) is checked against the ``/metrics`` of a
running cluster in ``test_observability_live.py``; here against the in-process gateway of
``tests/runtime/gateway/test_observability.py`` too (fast). ``failsoft-llm.json`` is checked
against a real :class:`~failsoft.runtime.llm_worker.LlmWorker` (a random tiny LM, in this process)
that served a request, its figures passed through the gateway's aggregation
(:class:`~failsoft.runtime.gateway.fleet.FleetFigures`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from failsoft.llm.corpus import encode
from failsoft.runtime.gateway.fleet import FleetFigures
from tests.runtime.gateway.test_observability import BODY, rig  # noqa: F401  (the fixture)
from tests.runtime.test_llm_service import GREEDY, PROMPTS, _store_random_lm, _wait

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def dashboard_metrics(name: str) -> set[str]:
    """Every ``failsoft_*`` series a dashboard's expressions and variables name."""
    board = json.loads((DASHBOARDS / name).read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    assert exprs, f"{name} has no expressions"
    return {m for e in exprs for m in re.findall(r"\bfailsoft_[a-z0-9_]+", e)}


def exposed(text: str) -> set[str]:
    """The series names an exposition offers (a family with no samples yet included)."""
    return {
        f"{f.name}{suffix}"
        for f in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(f.type, ("",))
    }


def missing(wanted: Iterable[str], text: str) -> list[str]:
    return sorted(set(wanted) - exposed(text))


def test_the_serving_dashboard_reads_only_metrics_the_gateway_serves(rig):  # noqa: F811
    client, _ = rig
    assert client.post("/v2/models/cam/infer", json=BODY).status_code == 200
    wanted = dashboard_metrics("failsoft.json")
    assert {"failsoft_agent_queue_wait_seconds_bucket", "failsoft_agent_device_memory_bytes"} <= wanted
    assert missing(wanted, client.get("/metrics").text) == []


@pytest.mark.slow
def test_an_llm_workers_figures_count_what_it_served_and_the_llm_dashboard_reads_them(tmp_path: Path):
    from failsoft.runtime.llm_worker import LlmWorker, LlmWorkerSpec

    _store_random_lm(tmp_path)
    worker = LlmWorker(LlmWorkerSpec("w0", tmp_path, "tiny-target", "cpu", 64, 8, 8, 1))
    try:
        worker.submit("r", encode(PROMPTS[0]), dict(GREEDY))
        assert _wait(lambda: worker.poll("r", 0, 0)["finished"])
        tokens = len(worker.poll("r", 0, 0)["tokens"])
        fleet = FleetFigures()
        fleet.add_source("worker", lambda: {"w0": _async(worker.metrics)})
        asyncio.run(fleet.refresh({}))
        registry = CollectorRegistry()
        registry.register(fleet)
        text = generate_latest(registry).decode()
    finally:
        worker.shutdown()
    assert missing(dashboard_metrics("failsoft-llm.json"), text) == []
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    labels = (("model", "tiny-target"), ("worker", "w0"))
    assert samples[("failsoft_llm_output_tokens_total", labels)] == tokens > 0
    assert samples[("failsoft_llm_ttft_seconds_count", labels)] == 1.0
    assert samples[("failsoft_llm_kv_pages_total", labels)] == 64.0
    assert samples[("failsoft_llm_kv_pages_used", labels)] == 0.0  # finished: its pages are back
    assert samples[("failsoft_llm_worker_up", (("worker", "w0"),))] == 1.0


def _async(fn):  # type: ignore[no-untyped-def]
    async def call() -> bytes:
        return fn()

    return call
