"""Per-request latency over HTTP of one model served as ONNX and as ``torch.export``, in one run.

    python examples/byom/bench_http.py /tmp/byom/zoo

(after the ``failsoft zoo add`` steps of docs/models.md, which put ``img/onnx`` and ``img/pt2`` in
the repository). Starts a real embedded cluster of two servers, each serving one app of family
``img`` (``img-onnx`` on s1 from the ONNX variant, ``img-pt2`` on s2 from the torch.export one),
then sends batch-1 requests to the two apps in turn (KServe v2 JSON over HTTP, one client, one
request at a time; the order alternates every round so a busy host slows both alike), and prints
JSON: the median and p90 client-side latency per app and their ratio. Absolute times depend on the
host; compare the ratio.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository

ROUNDS = 200
APPS = {"img-onnx": ("s1", "onnx"), "img-pt2": ("s2", "pt2")}


def main(root: Path) -> dict:
    repo = ModelRepository(root)
    x = repo.load("img", "onnx", "cpu").example_batch(1)
    config = config_from_dict(
        {
            "name": "bench-http",
            "repository": str(repo.root),
            "servers": [{"name": s, "site": s, "memory_mb": 2000, "compute": 4.0} for s in ("s1", "s2")],
            "apps": [
                {"name": app, "family": "img", "primary": {"server": s, "variant": v}}
                for app, (s, v) in APPS.items()
            ],
            "gateway": {"port": 0},
            "state_dir": tempfile.mkdtemp(prefix="bench-http-"),
        },
        source="bench_http",
    )
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    body = {"inputs": [tensor], "parameters": {"timeout": 30}}  # a busy host must not time the bench out
    samples: dict[str, list[float]] = {app: [] for app in APPS}
    with Session(config, num_cpus=2) as session, httpx.Client(base_url=session.url, timeout=30.0) as http:
        _wait_ready(http)
        for app in APPS:  # warm the path (connection, queues) before timing
            for _ in range(10):
                http.post(f"/v2/models/{app}/infer", json=body)
        for i in range(ROUNDS):
            for app in list(APPS)[:: 1 if i % 2 else -1]:
                began = time.perf_counter()
                answer = http.post(f"/v2/models/{app}/infer", json=body)
                samples[app].append((time.perf_counter() - began) * 1000.0)
                answer.raise_for_status()
    median = {a: round(statistics.median(v), 3) for a, v in samples.items()}
    p90 = {a: round(float(np.percentile(v, 90)), 3) for a, v in samples.items()}
    return {
        "batch": 1,
        "requests_per_app": ROUNDS,
        "median_ms": median,
        "p90_ms": p90,
        "onnx_over_pt2_median": round(median["img-onnx"] / median["img-pt2"], 3),
    }


def _wait_ready(http: httpx.Client, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = [http.get(f"/v2/models/{app}/ready").status_code == 200 for app in APPS]
        if all(ready):
            return
        time.sleep(0.5)
    raise SystemExit(f"the apps were not ready within {timeout_s} s")


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/byom/zoo"))))
