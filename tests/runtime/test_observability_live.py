"""A running cluster's ``/metrics`` shows every agent's figures, labelled by server, and one
request's trace joins the gateway's spans and the agent's.

A real embedded cluster (Ray on 127.0.0.1, two agents, the tiny digits MLP) serves a few requests
with ``telemetry.traces: otlp``, exporting to an OTLP/HTTP receiver this test runs on 127.0.0.1
(it decodes what each process sends with OpenTelemetry's own protobuf classes). The gateway's
``/metrics`` then holds each agent's queue, batch, inference, load and memory figures and every
series the Grafana dashboard reads; one request's trace holds the gateway's request and call spans
(the gateway's process) and the agent's, queue and model spans (the agent's process).
"""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from failsoft.runtime import telemetry
from failsoft.runtime.config import config_from_dict
from tests.runtime.conftest import serving
from tests.runtime.test_dashboards import dashboard_metrics, missing

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra is not installed")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
GOOD = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
REQUESTS = 5


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1; each span received as a dict."""
    spans: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = ExportTraceServiceRequest.FromString(
                self.rfile.read(int(self.headers["Content-Length"]))
            )
            for resource in request.resource_spans:
                service = next(
                    a.value.string_value for a in resource.resource.attributes if a.key == "service.name"
                )
                for scope in resource.scope_spans:
                    for s in scope.spans:
                        spans.append(
                            {
                                "service": service,
                                "name": s.name,
                                "trace": s.trace_id.hex(),
                                "id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(),
                            }
                        )
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", spans
    finally:
        server.shutdown()
        server.server_close()


def test_a_running_clusters_metrics_and_traces_cover_the_gateway_and_every_agent(
    tiny_zoo, tmp_path, monkeypatch
):
    config = config_from_dict(
        {
            "name": "observe-live",
            "repository": str(tiny_zoo.root),
            "servers": [
                {"name": "s1", "site": "a", "memory_mb": 200},
                {"name": "s2", "site": "b", "memory_mb": 200},
            ],
            "apps": [
                {"name": "cam", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
            ],
            "gateway": {"port": 0},
            "agents": {"restart": False},
            "telemetry": {"traces": "otlp"},
            "state_dir": str(tmp_path / "state"),
        },
        source="test",
    )
    with otlp_receiver() as (endpoint, spans):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)  # the agents are given it too
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
        try:
            with serving(config) as (session, _):
                assert telemetry.enabled()  # the gateway's process traces: each call carries its context
                with httpx.Client(base_url=session.url, timeout=30.0) as client:
                    for _ in range(REQUESTS):
                        answer = client.post("/v2/models/cam/infer", json=GOOD)
                        assert answer.status_code == 200, answer.text
                        assert len(answer.headers["x-request-id"]) == 32
                    text = client.get("/metrics").text
                trace = wait_trace(spans, 30.0)
        finally:
            telemetry.use_provider(None)  # this process's tracing ends with the session
    by_name = {s["name"]: s for s in trace}
    assert {s["service"] for s in trace} == {"failsoft-gateway", "failsoft-agent"}
    assert by_name["agent.call"]["parent"] == by_name["POST /v2/models/{name}/infer"]["id"]
    assert by_name["agent.infer"]["parent"] == by_name["agent.call"]["id"]  # across the processes
    assert (
        by_name["agent.queue"]["parent"] == by_name["model.predict"]["parent"] == by_name["agent.infer"]["id"]
    )
    assert by_name["agent.infer"]["service"] == "failsoft-agent"
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def values(family: str, suffix: str = "") -> dict[tuple[str, ...], float]:
        return {
            tuple(s.labels[k] for k in ("server", "app", "variant", "family") if k in s.labels): s.value
            for s in families[family].samples
            if s.name == family + suffix
        }

    def served(series: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
        return {labels: v for labels, v in series.items() if v}

    assert values("failsoft_agent_up") == {("s1",): 1.0, ("s2",): 1.0}
    # every loaded copy has its series (a warm backup's on s2 at zero, once loaded); only cam's
    # primary served
    assert served(values("failsoft_agent_queue_wait_seconds", "_count")) == {("s1", "cam", "mlp_s"): REQUESTS}
    assert values("failsoft_agent_inference_seconds", "_count")[("s1", "cam", "mlp_s")] >= 1
    assert served(values("failsoft_agent_batch_size", "_sum")) == {("s1", "cam", "mlp_s"): REQUESTS}
    depths = values("failsoft_agent_queue_depth")
    assert ("s1", "cam", "mlp_s") in depths and set(depths.values()) == {0.0}
    assert values("failsoft_agent_load_seconds", "_count")[("s1", "mlp_s", "digits_mlp")] >= 1
    rss = values("failsoft_agent_resident_memory_bytes")
    assert set(rss) == {("s1",), ("s2",)} and min(rss.values()) > 50 * 2**20  # torch is imported
    assert values("failsoft_agent_model_memory_bytes")[("s1", "cam", "mlp_s")] > 0
    assert missing(dashboard_metrics("failsoft.json"), text) == []


TRACE = {"POST /v2/models/{name}/infer", "agent.call", "agent.infer", "agent.queue", "model.predict"}


def wait_trace(spans: list[dict[str, str]], timeout_s: float) -> list[dict[str, str]]:
    """The spans of the first request whose trace has all five, once both processes exported them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        traces: dict[str, list[dict[str, str]]] = {}
        for s in list(spans):
            traces.setdefault(s["trace"], []).append(s)
        for trace in traces.values():
            if {s["name"] for s in trace} >= TRACE:
                return [s for s in trace if s["name"] in TRACE]
        time.sleep(0.1)
    raise AssertionError(
        f"no complete trace in {timeout_s} s; spans received: {sorted({s['name'] for s in spans})}"
    )
