"""Per-request latency of the ONNX variant through failsoft against a bare onnxruntime session, and
against the torch variants of the same model, at batch 1 with one thread each. Prints JSON.

    python examples/byom/bench.py /tmp/byom/zoo

(after the ``failsoft zoo add`` steps of docs/models.md). The calls are interleaved, 30 rounds of
20, so that a busy host slows each the same; compare the ratios, and the ONNX overhead in ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import torch

from failsoft.zoo import ModelRepository

ROUNDS, CALLS = 30, 20


def main(root: Path) -> dict:
    torch.set_num_threads(1)
    repo = ModelRepository(root)
    models = {v: repo.load("img", v, "cpu") for v in ("onnx", "hf", "pt2")}
    x = models["onnx"].example_batch(1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    onnx_file = str(repo.variant_dir("img", "onnx") / "model.onnx")
    bare = ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
    name = bare.get_inputs()[0].name
    calls: dict[str, Callable[[], object]] = {"bare_onnxruntime": lambda: bare.run(None, {name: x})}
    calls |= {f"failsoft_{v}": (lambda m=m: m.predict(x)) for v, m in models.items()}
    samples: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(ROUNDS):
        for key, call in calls.items():
            began = time.perf_counter()
            for _ in range(CALLS):
                call()
            samples[key].append((time.perf_counter() - began) / CALLS * 1000.0)
    median = {k: round(statistics.median(v), 4) for k, v in samples.items()}
    return {
        "batch": 1,
        "threads": 1,
        "median_ms": median,
        "onnx_added_ms": round(median["failsoft_onnx"] - median["bare_onnxruntime"], 4),
        "onnx_over_torch": {
            v: round(median["failsoft_onnx"] / median[f"failsoft_{v}"], 3) for v in ("hf", "pt2")
        },
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/byom/zoo"))))
