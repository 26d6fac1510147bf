"""Does a small recovery load slow down when a heavy load runs in the same agent process?

    PYTHONPATH=src python tools/lock_probe.py --hogs 0
    PYTHONPATH=src python tools/lock_probe.py --hogs 2      # a host the recovery saturates

An agent loads up to ``max_parallel_loads`` models at once, each in a thread of its one process,
so a small load beside a heavy one shares Python's interpreter lock with it: the heavy load's
Python work could hold the small one back (the simulator does not model the lock). This times a
small model's load as the agent does it (``ModelRepository.load`` and one batch-1 answer, one
torch thread) three ways, with the same files in the page cache:

    alone           nothing else loading
    other_process   a heavy model (ResNet-18) loading again and again in another process: the
                    cores shared, the lock not
    same_process    the same heavy loads in another thread of this process: cores and lock shared

``--hogs N`` adds N processes that spin, so the probe meets a saturated host as a recovery does
(their PIDs are stopped at the end). Prints one JSON object: per small variant and way, the median
wall and thread-CPU milliseconds over ``--repeats`` loads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

import numpy as np
import torch

from failsoft.zoo.repository import ModelRepository, resolve_repository

SMALL = (("digits_cnn", "cnn_xs"), ("digits_mlp", "mlp_xs"), ("sp500_gru", "gru_16"))
HEAVY = ("resnet", "resnet18")
WAYS = ("alone", "other_process", "same_process")


def timed_load(repo: ModelRepository, family: str, variant: str) -> tuple[float, float]:
    """(wall ms, this thread's CPU ms) of one load and its first batch-1 answer."""
    wall, cpu = time.perf_counter(), time.thread_time()
    model = repo.load(family, variant, "cpu")
    model.predict(np.zeros((1, *model.input_shape), dtype=np.float32))
    return (time.perf_counter() - wall) * 1000.0, (time.thread_time() - cpu) * 1000.0


def heavy_loads(stop: Any, root: str) -> None:
    torch.set_num_threads(1)
    repo = ModelRepository(root)
    while not stop.is_set():
        timed_load(repo, *HEAVY)


def spin(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


def probe(repeats: int, hogs: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    root = str(resolve_repository(None))
    repo = ModelRepository(root)
    for family, variant in (*SMALL, HEAVY):  # the page cache and the imports, once
        timed_load(repo, family, variant)
    fork = mp.get_context("fork")
    stop_hogs = fork.Event()
    spinners = [fork.Process(target=spin, args=(stop_hogs,)) for _ in range(hogs)]
    for p in spinners:
        p.start()
    out: dict[str, Any] = {}
    try:
        for way in WAYS:
            stop = fork.Event() if way == "other_process" else threading.Event()
            beside: Any = None
            if way == "other_process":
                beside = fork.Process(target=heavy_loads, args=(stop, root))
            elif way == "same_process":
                beside = threading.Thread(target=heavy_loads, args=(stop, root))
            if beside is not None:
                beside.start()
                time.sleep(0.5)
            for family, variant in SMALL:
                samples = []
                for _ in range(repeats):
                    samples.append(timed_load(repo, family, variant))
                    time.sleep(0.013)  # land at varied points of the heavy load
                out.setdefault(variant, {})[way] = {
                    "wall_ms": round(statistics.median(s[0] for s in samples), 1),
                    "cpu_ms": round(statistics.median(s[1] for s in samples), 1),
                }
            stop.set()
            if beside is not None:
                beside.join()
    finally:
        stop_hogs.set()
        for p in spinners:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return {"hogs": hogs, "repeats": repeats, "heavy": "/".join(HEAVY), "small": out}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=0, help="processes that spin beside the probe")
    args = parser.parse_args()
    print(json.dumps(probe(args.repeats, args.hogs), indent=1))


if __name__ == "__main__":
    main()
