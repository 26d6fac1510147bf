"""A running cluster's ``/metrics`` shows every agent's figures, labelled by server.

A real embedded cluster (Ray on 127.0.0.1, two agents, the tiny digits MLP) serves a few requests
with tracing on (``telemetry.traces: console``: the trace context then travels in each call's
``meta`` through Ray to the agent, which must accept it); the gateway's ``/metrics`` then holds
each agent's queue, batch, inference, load and memory figures, and every series the Grafana
dashboard reads.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from failsoft.runtime import telemetry
from failsoft.runtime.config import config_from_dict
from tests.runtime.conftest import serving
from tests.runtime.test_dashboards import dashboard_metrics, missing

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
GOOD = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
REQUESTS = 5


def test_a_running_clusters_metrics_show_every_agents_figures_by_server(tiny_zoo, tmp_path):
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
            "telemetry": {"traces": "console"},
            "state_dir": str(tmp_path / "state"),
        },
        source="test",
    )
    try:
        with serving(config) as (session, _):
            assert telemetry.enabled()  # the gateway's process traces: each call carries its context
            with httpx.Client(base_url=session.url, timeout=30.0) as http:
                for _ in range(REQUESTS):
                    answer = http.post("/v2/models/cam/infer", json=GOOD)
                    assert answer.status_code == 200, answer.text
                    assert len(answer.headers["x-request-id"]) == 32
                text = http.get("/metrics").text
    finally:
        telemetry.use_provider(None)  # this process's tracing ends with the session
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def values(family: str, suffix: str = "") -> dict[tuple[str, ...], float]:
        return {
            tuple(s.labels[k] for k in ("server", "app", "variant", "family") if k in s.labels): s.value
            for s in families[family].samples
            if s.name == family + suffix
        }

    assert values("failsoft_agent_up") == {("s1",): 1.0, ("s2",): 1.0}
    assert values("failsoft_agent_queue_wait_seconds", "_count") == {("s1", "cam", "mlp_s"): REQUESTS}
    assert values("failsoft_agent_inference_seconds", "_count")[("s1", "cam", "mlp_s")] >= 1
    assert values("failsoft_agent_batch_size", "_sum") == {("s1", "cam", "mlp_s"): REQUESTS}
    assert values("failsoft_agent_queue_depth") == {("s1", "cam", "mlp_s"): 0.0}
    assert values("failsoft_agent_load_seconds", "_count")[("s1", "mlp_s", "digits_mlp")] >= 1
    rss = values("failsoft_agent_resident_memory_bytes")
    assert set(rss) == {("s1",), ("s2",)} and min(rss.values()) > 50 * 2**20  # torch is imported
    assert values("failsoft_agent_model_memory_bytes")[("s1", "cam", "mlp_s")] > 0
    assert missing(dashboard_metrics("failsoft.json"), text) == []
