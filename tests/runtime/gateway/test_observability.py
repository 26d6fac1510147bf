"""Traces, request ids, access log and the agents' metrics at the gateway, in-process.

The gateway is the real one (its middleware, dispatcher and call primitive) over a fake controller.
Server ``s1``'s agent is the agent's own serving code, run in this process: a real
:class:`~failsoft.runtime.serving.ServingQueue` behind :func:`failsoft.runtime.telemetry.serve`, and
a real :class:`~failsoft.runtime.agent_metrics.AgentMetrics`; only the transport between the two
processes (Ray) is left out, and the call's ``meta`` dict is all that crosses it, as across Ray.
Spans go to the SDK's ``InMemorySpanExporter``. The same over a real cluster:
``tests/runtime/test_observability_live.py``.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from failsoft.clock import MonotonicClock
from failsoft.domain import App, Server, Variant
from failsoft.policies import registry
from failsoft.policies.queueing import ServiceModel
from failsoft.runtime import logs, telemetry
from failsoft.runtime.agent_metrics import AgentMetrics
from failsoft.runtime.chaos import Chaos
from failsoft.runtime.config import GatewaySettings
from failsoft.runtime.gateway import Gateway, ModelMeta
from failsoft.runtime.serving import ServingQueue
from tests.runtime.gateway.fakes import CLASSES, FakeAgent, FakeController, route_entry

TOKEN = "a-test-token-of-some-length"
PROFILE = Variant("big", 1.0, 0.9, 10.0, 1.0)
BODY = {"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32", "data": [0.5] * 8}]}
GATEWAY_SPAN = "POST /v2/models/{name}/infer"


def _predict(x: np.ndarray) -> np.ndarray:
    out = np.zeros((len(x), CLASSES), dtype=np.float32)
    out[:, 3] = 1.0
    return out


class QueueAgent:
    """The agent's side of an ``infer`` call as its process runs it (queue, spans, metrics); the
    call reaches it with no context but its arguments (an executor thread, no contextvars)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.figures = AgentMetrics(server, self._snapshot)
        self.queue = ServingQueue(
            f"{server}/cam/big",
            _predict,
            (4,),
            registry.make("queueing", "fifo", 8, 256),
            ServiceModel(PROFILE),
            on_batch=self.figures.batch_observer("cam", "big"),
        ).start()
        self.calls: list[dict[str, Any]] = []

    def _snapshot(self) -> dict[str, Any]:
        return {
            "queues": {"cam/big": self.queue.stats()},
            "models_mb": {("cam", "big"): 1.0},
            "budget_mb": 100,
        }

    async def infer(self, app, variant, batch, timeout_s, request_id=None, meta=None):
        self.calls.append({"request_id": request_id, "meta": meta})
        where = {"failsoft.server": self.server, "failsoft.app": app, "failsoft.variant": variant}
        run = functools.partial(telemetry.serve, self.queue, batch, timeout_s, request_id, meta, where)
        return await asyncio.get_running_loop().run_in_executor(None, run)

    async def metrics(self, timeout_s: float = 2.0) -> bytes:
        return self.figures.render()

    def cancel_nowait(self, request_id: str) -> None:
        self.queue.cancel(request_id)


@pytest.fixture
def rig() -> Iterator[tuple[TestClient, QueueAgent]]:
    clock = MonotonicClock()
    agent = QueueAgent("s1")
    agents: dict[str, Any] = {"s1": agent, "s2": FakeAgent("s2", clock, latency_s=0.0)}
    controller = FakeController(clock, {"cam": route_entry("s1")})  # type: ignore[arg-type]
    gateway = Gateway(
        GatewaySettings(max_batch=8),
        controller,  # type: ignore[arg-type]
        agents,  # type: ignore[arg-type]
        Chaos([Server("s1", "a", 100.0), Server("s2", "b", 100.0)], agents),  # type: ignore[arg-type]
        {"cam": App("cam", "fam", slo_ms=100.0)},
        {"fam": ModelMeta((4,), CLASSES)},
        {"fam": ["small", "big"]},
        TOKEN,
    )
    try:
        with TestClient(gateway.app) as client:
            yield client, agent
    finally:
        agent.queue.close(5.0)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.use_provider(None)


def test_one_request_is_one_trace_from_the_gateway_through_the_call_to_the_queue_and_the_model(rig, spans):
    client, agent = rig
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = {"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01"}
    response = client.post("/v2/models/cam/infer", json=BODY, headers=parent)
    assert response.status_code == 200, response.text
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {GATEWAY_SPAN, "agent.call", "agent.infer", "agent.queue", "model.predict"}
    assert {f"{s.context.trace_id:032x}" for s in by_name.values()} == {client_trace}  # the client's trace
    chain = [(GATEWAY_SPAN, None), ("agent.call", GATEWAY_SPAN), ("agent.infer", "agent.call")]
    chain += [("agent.queue", "agent.infer"), ("model.predict", "agent.infer")]
    for child, parent_name in chain:
        expected = by_name[parent_name].context.span_id if parent_name else 0x00F067AA0BA902B7
        assert by_name[child].parent is not None and by_name[child].parent.span_id == expected, child
    (call,) = agent.calls
    assert set(call["meta"]) >= {"traceparent"}  # the context crossed as plain strings
    assert by_name["model.predict"].attributes["failsoft.batch_rows"] == 2
    assert by_name["agent.infer"].attributes["failsoft.server"] == "s1"
    assert by_name[GATEWAY_SPAN].attributes["http.response.status_code"] == 200
    queue, predict = by_name["agent.queue"], by_name["model.predict"]
    assert queue.start_time <= queue.end_time <= predict.start_time <= predict.end_time


def test_with_tracing_off_no_span_is_made_and_the_call_carries_no_meta(rig):
    client, agent = rig
    assert not telemetry.enabled() and telemetry.inject() == {}
    with telemetry.call_span("s1", "cam", "big") as meta:
        assert meta == {}
    assert client.post("/v2/models/cam/infer", json=BODY).status_code == 200
    assert agent.calls[-1]["meta"] is None  # not sent at all: nothing to carry


def test_every_request_gets_an_id_that_names_its_calls_and_one_access_log_line(rig):
    client, agent = rig
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("gateway"))
    access = logging.getLogger("failsoft.access")
    access.addHandler(handler)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        ok = client.post("/v2/models/cam/infer", json=BODY)
        unknown = client.post("/v2/models/nope/infer", json=BODY)
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    rid = ok.headers["x-request-id"]
    assert len(rid) == 32 and unknown.headers["x-request-id"] != rid
    assert agent.calls[-1]["request_id"].startswith(rid)  # the agent's call is named after it
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["method"], x["path"], x["status"], x["service"]) for x in lines] == [
        ("POST", "/v2/models/cam/infer", 200, "cam"),
        ("POST", "/v2/models/nope/infer", 404, "nope"),
    ]
    assert [x["request_id"] for x in lines] == [rid, unknown.headers["x-request-id"]]
    assert all(
        x["ms"] > 0 and x["component"] == "gateway" and x["logger"] == "failsoft.access" for x in lines
    )


def test_a_record_logged_while_serving_a_request_carries_its_id():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("agent s1"))
    logger = logging.getLogger("failsoft.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    token = logs.request_id.set("abc123")
    try:
        logger.warning("slow batch", extra={"ms": 12.5})
    finally:
        logs.request_id.reset(token)
        logger.removeHandler(handler)
    (line,) = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert line["request_id"] == "abc123" and line["ms"] == 12.5 and line["component"] == "agent s1"
    assert line["level"] == "WARNING" and line["message"] == "slow batch" and line["ts"].endswith("Z")


def test_metrics_serve_every_agents_figures_by_server_and_an_agent_that_does_not_answer_is_down(rig):
    client, _ = rig
    for _ in range(3):
        assert client.post("/v2/models/cam/infer", json=BODY).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    up = {s.labels["server"]: s.value for s in families["failsoft_agent_up"].samples}
    assert up == {"s1": 1.0, "s2": 0.0}  # s2's stand-in has no metrics call: down, not stale
    waits = [s for s in families["failsoft_agent_queue_wait_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["server"], s.labels["app"], s.labels["variant"], s.value) for s in waits] == [
        ("s1", "cam", "big", 3.0)
    ]
    rows = [s for s in families["failsoft_agent_batch_size"].samples if s.name.endswith("_sum")]
    assert [s.value for s in rows] == [6.0]
    served = {
        s.labels["outcome"]: s.value
        for s in families["failsoft_agent_queue_requests"].samples
        if s.name.endswith("_total")
    }
    assert served["served"] == 3.0 and served["refused"] == 0.0
    assert "failsoft_requests" in families  # the gateway's own, in the same exposition
