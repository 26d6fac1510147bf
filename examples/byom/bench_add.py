"""How long ``failsoft zoo add`` takes for a ResNet-18-size ONNX model, profile included. Prints JSON.

    python examples/byom/bench_add.py /tmp/byom-add [--quick]

Builds ResNet-18 (``transformers``' ResNet with basic blocks, depths 2-2-2-2, widths 64-512, 1000
classes, 11.7 M parameters, random weights: nothing downloaded), exports it to ONNX at 224x224
(not timed), then times ``failsoft zoo add`` of it, as a user runs it, with the default profile
(or ``--quick``): the copy, hash, load, sample checks, accuracy and the profiler's loads and latency
per batch size.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def build(out: Path) -> Path:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from failsoft.zoo.formats.examples import _logits_module, export_onnx

    torch.manual_seed(0)
    config = ResNetConfig(  # type: ignore[call-arg]
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
        num_labels=1000,
    )  # fmt: skip
    model = ResNetForImageClassification(config).eval()
    path = out / "resnet18.onnx"
    export_onnx(_logits_module(model, "pixel_values"), torch.rand(1, 3, 224, 224), path, "pixel_values")
    np.save(out / "sample.npy", np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32))
    return path


def main(out: Path, quick: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    path = build(out)
    zoo = out / "zoo"
    shutil.rmtree(zoo, ignore_errors=True)
    cmd = ["failsoft", "zoo", "add", "resnet/r18", str(path), "--accuracy", "0.697",
           "--sample", str(out / "sample.npy"), "--out", str(zoo)]  # fmt: skip
    cmd += ["--quick"] if quick else []
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    profile = json.loads((zoo / "resnet" / "r18" / "profile.json").read_text())
    return {
        "model": "resnet18 (onnx, 224x224, 1000 classes)",
        "onnx_mb": round(path.stat().st_size / 2**20, 1),
        "quick": quick,
        "zoo_add_s": round(wall_s, 1),
        "target_s": 60,
        "profile": {k: profile.get(k) for k in ("load_ms", "latency_ms", "memory_mb")},
        "line": done.stdout.strip(),
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    print(json.dumps(main(Path(args[0] if args else "/tmp/byom-add"), "--quick" in sys.argv)))
