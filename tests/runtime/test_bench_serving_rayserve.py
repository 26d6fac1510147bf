"""The serving benchmark's Ray Serve anchor, for real: Ray Serve 2.60 in a process of its own (its own
Ray instance on 127.0.0.1, one replica with ``@serve.batch``), the real load client, short levels.
While it is up, the test asks it itself (JSON, binary, and a batch of three rows) and compares the
answers with the model's logits in this process; then the benchmark's JSON must hold its row, and
none of the anchor's processes (its driver, raylet, GCS, workers) may be left when the run is over.

Ray Serve is an optional dependency (the extra ``failsoft[anchors]``): without it the test is skipped.
"""

from __future__ import annotations

import contextlib
import json
import re

import httpx
import numpy as np
import psutil
import pytest
import yaml

from failsoft.bench.serving import ServingSettings, run
from failsoft.bench.serving_load import encode_request, request_input

pytest.importorskip("ray.serve", reason="Ray Serve is optional (pip install 'failsoft[anchors]')")
pytestmark = [pytest.mark.runtime, pytest.mark.slow]
NAME = "ray-serve-batch"
READY = re.compile(rf"^\[{NAME}\] answering on 127\.0\.0\.1:(\d+)")


def _ask(port: int, x: np.ndarray, binary: bool) -> np.ndarray:
    body = encode_request(x, "binary" if binary else "json")
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v2/models/ocr/infer", content=body.data, headers=body.headers(), timeout=30
    )
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["model_name"] == "ocr"
    return np.asarray(out["outputs"][0]["data"], dtype=np.float32).reshape(out["outputs"][0]["shape"])


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(300)  # a Ray instance and Serve's three actors started on a busy 2-core machine
def test_ray_serve_answers_the_models_logits_and_is_measured_then_gone(tiny_zoo, tmp_path):
    app = {"name": "ocr", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "bench-serving-rayserve-test",
                "repository": str(tiny_zoo.root),
                "servers": [{"name": "s1", "site": "a", "memory_mb": 100, "compute": 4.0}],
                "apps": [app],
            }
        )
    )
    model = tiny_zoo.load("digits_mlp", "mlp_s")
    shape = tuple(model.input_shape)
    anchor_processes: list[psutil.Process] = []

    def while_up(message: str) -> None:  # the benchmark's progress, said while the anchor serves
        if not (match := READY.match(message)):
            return
        port = int(match.group(1))
        one = request_input(shape)
        three = np.random.default_rng(1).random((3, *shape), dtype=np.float32)
        for x in (one, three):
            expected = model.predict(x)
            for binary in (False, True):
                got = _ask(port, x, binary)
                assert got.shape == expected.shape
                np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        assert not np.allclose(model.predict(one), model.predict(three[:1]))  # the inputs tell apart
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any("serving_anchor_rayserve" in part for part in child.cmdline()):
                    anchor_processes.extend([child, *child.children(recursive=True)])

    settings = ServingSettings(concurrency=(1,), duration_s=0.3, warmup_s=0.1, systems=(NAME,))
    out = run(config, settings, progress=while_up)
    json.dumps(out)  # what the command prints

    assert len(anchor_processes) >= 4, anchor_processes  # the driver, GCS, raylet, Serve's workers
    alive = [p for p in anchor_processes if _alive(p)]
    names = " ".join(f"{p.pid}:{p.name()}" for p in alive)
    assert not names, f"left running after the benchmark: {names}"
    row = out["systems"][NAME]
    assert row["status"] == "measured"
    assert row["settings"]["num_replicas"] == 1
    batching = row["settings"]["batching"]
    assert batching["max_batch_size"] >= 1 and 0 < batching["batch_wait_timeout_s"] < 1
    assert set(row["answer_check"]) == {"json", "binary"}
    assert all(check["max_abs_diff"] <= 1e-5 for check in row["answer_check"].values())
    for encoding in ("json", "binary"):
        levels = row[encoding]
        assert set(levels) == {"closed_1", "open"}, levels
        for level in levels.values():
            assert level["requests"] > 0 and level["rps"] > 0
            assert level["errors"] == 0 and set(level["codes"]) == {"200"}, level
            assert level["server_cpu_ms_per_request"] > 0  # Ray's processes are counted, by process
            assert any(k.startswith("ray::ServeReplica") for k in level["server_cpu_ms_by_process"]), level
