"""``failsoft bench serving`` on a real one-server cluster, a real FastAPI anchor and a real client,
with short levels: the JSON has every system's figures, and failsoft answered without errors (Ray
Serve's anchors: ``test_bench_serving_rayserve.py``)."""

from __future__ import annotations

import json

import pytest
import yaml

from failsoft.bench.serving import ServingSettings, run

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
LEVEL_KEYS = {"requests", "errors", "codes", "rps", "p50_ms", "p99_ms", "server_cpu_ms_per_request"}
PHASES = {
    "parse",
    "dispatch",
    "agent_call",
    "queue_wait",
    "batch",
    "inference",
    "answer",
    "response",
    "http",
}


@pytest.mark.timeout(900)  # a cluster, an anchor and 13 client processes on a busy 2-core machine
def test_the_serving_benchmark_measures_every_system_side_by_side(tiny_zoo, tmp_path):
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "bench-serving-test",
                "repository": str(tiny_zoo.root),
                "servers": [{"name": "s1", "site": "a", "memory_mb": 100, "compute": 4.0}],
                "apps": [
                    {"name": "ocr", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
                ],
                "failover": {"warm_replicas": 0},
            }
        )
    )
    systems = ("inprocess", "failsoft", "failsoft-ray", "fastapi")  # Ray Serve: its own test
    settings = ServingSettings(concurrency=(1, 4), duration_s=0.5, warmup_s=0.2, systems=systems)
    out = run(config, settings, progress=lambda _: None)
    json.dumps(out)  # what the command prints
    assert out["app"] == "ocr" and out["model"] == "digits_mlp/mlp_s"
    systems = out["systems"]
    assert systems["inprocess"]["rps"] > 0 and systems["inprocess"]["p50_ms"] > 0
    assert systems["inprocess"]["cold_p50_ms"] > 0  # predict after the caches were swept
    assert systems["fastapi"]["answer_check"]["json"]["max_abs_diff"] <= 1e-5  # the model's logits
    for name in ("failsoft", "failsoft-ray", "fastapi"):
        for encoding in ("json", "binary"):
            levels = systems[name][encoding]
            assert set(levels) == {"closed_1", "closed_4", "open"}, levels
            for level in levels.values():
                assert set(level) >= LEVEL_KEYS, level
                assert level["requests"] > 0 and level["rps"] > 0
    for name in ("failsoft", "failsoft-ray"):  # failsoft answered everything, over either transport
        assert systems[name]["transport"] == {"failsoft": "zmq", "failsoft-ray": "ray"}[name]
        for encoding in ("json", "binary"):
            for level in systems[name][encoding].values():
                assert level["errors"] == 0 and set(level["codes"]) == {"200"}, level
                assert level["server_cpu_ms_per_request"] > 0
    hop = systems["failsoft"]["transport_rtt"]  # the gateway -> agent call alone, both transports
    for transport in ("zmq", "ray"):
        assert set(hop[transport]) == {"in_flight_1", "in_flight_8"}
        assert all(v["calls"] > 0 and v["p50_ms"] > 0 for v in hop[transport].values())
    phases = systems["failsoft"]["phases"]
    assert set(phases) >= PHASES and phases["inference"] > 0 and phases["agent_call"] >= phases["inference"]
    assert set(out["ratios"]) == {"failsoft_to_fastapi", "failsoft_to_failsoft_ray", "failsoft_to_inprocess"}
    assert out["ratios"]["failsoft_to_fastapi"]["json_closed_1"] > 0
