"""The measuring half of the profiler, run in a fresh process per variant (``python -m``).

A fresh process is what makes the memory number honest: resident-set growth is measured from a
process that has imported torch and the model's code but holds no model, to the moment the loaded
model has given its first answer. In the same process it then times several cold loads (page cache
evicted, disk to first answer) and the latency of batches of 1 to 16.

It prints one JSON object on stdout. On a failsoft error it prints ``{"error": ..., "type": ...}``
and exits with status 2, so the parent can raise the same error.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.errors import FailsoftError
from failsoft.zoo import pagecache
from failsoft.zoo.formats.model import HandlerModel
from failsoft.zoo.formats.model import import_code as import_user_code
from failsoft.zoo.loaded import LoadedModel
from failsoft.zoo.repository import ModelRepository

MIB = 2**20


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _timed_load(
    repo: ModelRepository, family: str, variant: str, device: str, evict: bool
) -> tuple[LoadedModel, float, float, bool]:
    """A load to its first answer: the model, wall and CPU milliseconds, and whether the weights were
    evicted from the page cache first. The CPU time is the whole probe process's (every torch
    thread's; nothing else runs in it), so it is the load's work; wall minus CPU waited (for the
    disk, or for a core). On a GPU it is the host's part only."""
    weights = repo.variant_dir(family, variant) / repo.config(family, variant).weights_file
    files = sorted(p for p in weights.rglob("*") if p.is_file()) if weights.is_dir() else [weights]
    evicted = evict and all([pagecache.evict(f) for f in files])
    start, cpu = time.perf_counter(), time.process_time()
    model = repo.load(family, variant, device)
    first = model.example_batch(1) if isinstance(model, HandlerModel) else None  # the user's sample
    model.predict(first if first is not None else np.zeros((1, *model.input_shape), dtype=np.float32))
    return model, (time.perf_counter() - start) * 1000.0, (time.process_time() - cpu) * 1000.0, evicted


def measure(repo: ModelRepository, family: str, variant: str, device: str, settings: dict[str, Any]) -> dict:
    """Memory of the first load, load times, and latency per batch size, for one variant."""
    import torch

    from failsoft.zoo.machine import machine_info
    from failsoft.zoo.network import import_code

    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    config = repo.config(family, variant)
    if config.model_format == "builtin":
        import_code(config)
    else:
        import_user_code(repo.variant_dir(family, variant), config)
    torch.ones(8, 8) @ torch.ones(8, 8)  # thread pools up before the baseline
    gc.collect()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
    rss0, cuda0 = _rss(), torch.cuda.memory_allocated(device) if cuda else 0
    evict = settings["evict_page_cache"]
    model, first_ms, first_cpu_ms, evicted = _timed_load(repo, family, variant, device, evict)
    memory: dict[str, Any] = {"rss_growth_mb": (_rss() - rss0) / MIB}
    if cuda:
        memory["cuda_allocated_mb"] = (torch.cuda.memory_allocated(device) - cuda0) / MIB
        memory["cuda_peak_mb"] = (torch.cuda.max_memory_allocated(device) - cuda0) / MIB
    model.close()
    loads, loads_cpu = [first_ms], [first_cpu_ms]
    for _ in range(settings["loads"] - 1):
        model, ms, cpu_ms, evicted = _timed_load(repo, family, variant, device, evict)
        loads.append(ms)
        loads_cpu.append(cpu_ms)
        model.close()
    warm = []
    for _ in range(settings.get("warm_loads", 0)):
        model, ms, _, _ = _timed_load(repo, family, variant, device, evict=False)
        warm.append(ms)
        model.close()
    model = repo.load(family, variant, device)
    latency = {str(bs): _latency(model, bs, settings) for bs in settings["batch_sizes"]}
    model.close()
    return {
        "memory": memory,
        "load_samples_ms": loads,
        "load_cpu_samples_ms": loads_cpu,
        "warm_load_samples_ms": warm,
        "page_cache_evicted": evicted,
        "latency": latency,
        "machine": machine_info(device),
    }


def _latency(model: LoadedModel, batch_size: int, settings: dict[str, Any]) -> dict[str, float]:
    x = model.example_batch(batch_size)
    for _ in range(settings["warmup_iters"]):
        model.predict(x)
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < settings["max_iters"]:
        start = time.perf_counter()
        model.predict(x)
        samples.append((time.perf_counter() - start) * 1000.0)
        if len(samples) >= settings["min_iters"] and time.perf_counter() - began >= settings["budget_s"]:
            break
    arr = np.asarray(samples)
    mean = float(arr.mean())
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": mean,
        "samples": len(samples),
        "throughput_rps": batch_size * 1000.0 / mean,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root, family, variant, device, settings_json = args
    try:
        out = measure(ModelRepository(Path(root)), family, variant, device, json.loads(settings_json))
    except FailsoftError as exc:
        print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
