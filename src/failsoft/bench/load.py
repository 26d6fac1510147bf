"""``failsoft bench load``: where a cold load's time goes, phase by phase, beside its limit.

A recovery's MTTR is mostly one model load (FailLite 5.2), and an agent's load is: read the
safetensors file (mapped, nothing copied), build the module's skeleton on PyTorch's ``meta`` device,
assign the tensors to it, and answer a first batch-1 request (which touches every weight once, so
the copy from the page cache happens here). Its limit is what no loader can avoid: the weight bytes
moved once at the host's copy bandwidth, plus one batch-1 answer of the warm model. This benchmark
times each phase with the loader's own functions (:mod:`failsoft.zoo.network`), in this process,
with the file in the page cache (read once before), and prints per variant::

    read_ms, skeleton_ms, assign_ms, first_answer_ms   the phases (medians over repeats)
    load_ms                                            their sum: a cold load as the agent does it
    copy_ms = weight bytes / copy bandwidth            measured here with numpy, same bytes
    answer_ms                                          a batch-1 answer of the loaded model, warm
    limit_ms = copy_ms + answer_ms, ratio = load_ms / limit_ms   (issue target: ratio <= 2)

The agent's remaining phases (warm-up answers beyond the first, the route's publication, the
controller's call) are timed end to end by ``failsoft bench failover``. Compare figures of one run
only: on a shared host every phase stretches with the load.

Beside them, ``to_route`` compares, in CPU milliseconds of the loading thread (a busy host
stretches wall time, far less the CPU a phase takes), the agent's recovery load *before* and
*after* it took its skeleton ahead and cut its warm-up to the first answer, the two ways
alternated within each repeat::

    before: read, skeleton (built), assign, warm_up (every warm-up size, as a load used to)
    after:  read, skeleton (taken: prepared ahead), assign, first_answer
            and, off the route's path: skeleton_ahead (its build) and warm_up_after_route
    ratio = after.total / before.total

with the warm-up's batch sizes, the first answer's CPU over a warm batch-1 answer's (what a first
call costs beyond the answer itself), and what one skeleton takes in memory (``skeleton_kib``:
Python objects; on ``meta`` its parameters have no storage).
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from failsoft.errors import ConfigError
from failsoft.zoo.repository import ModelRepository

PHASES = ("read_ms", "skeleton_ms", "assign_ms", "first_answer_ms")


@dataclass(frozen=True)
class LoadBenchSettings:
    variants: tuple[str, ...]  # "family/variant"
    repeats: int = 5
    threads: int = 1  # torch threads: an agent runs one

    def __post_init__(self) -> None:
        if not self.variants:
            raise ConfigError("name at least one variant as family/variant")
        for name in self.variants:
            if name.count("/") != 1:
                raise ConfigError(f"a variant is named family/variant, got {name!r}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be at least 1, got {self.repeats}")


def run(repo: ModelRepository, settings: LoadBenchSettings) -> dict[str, Any]:
    """Each variant's phases, limit and ratio (module docstring)."""
    import torch

    torch.set_num_threads(settings.threads)
    rows = {}
    for name in settings.variants:
        family, variant = name.split("/")
        rows[name] = _variant(repo, family, variant, settings.repeats)
    return {
        "benchmark": "load",
        "threads": settings.threads,
        "repeats": settings.repeats,
        "variants": rows,
        "target": "ratio <= 2 (load_ms over weight bytes / copy bandwidth + one batch-1 answer)",
    }


def _variant(repo: ModelRepository, family: str, variant: str, repeats: int) -> dict[str, Any]:
    from failsoft.zoo.layout import read_config
    from failsoft.zoo.network import import_code, weights_path

    path = repo.variant_dir(family, variant)
    config = read_config(path)
    if config.model_format != "builtin" or config.stateful:
        raise ConfigError(f"{family}/{variant}: only the zoo's builtin, stateless variants are timed")
    weights = weights_path(path)
    data = np.fromfile(weights, dtype=np.uint8)  # in the page cache from here on
    import_code(config)
    runs = [_phases(path, config) for _ in range(repeats)]
    to_route = _to_route(repo, family, variant, repeats)
    phases = {p: round(statistics.median(r[p] for r in runs), 2) for p in PHASES}
    load_ms = round(statistics.median(sum(r[p] for p in PHASES) for r in runs), 2)
    copy_ms = _copy_ms(data, repeats)
    answer_ms = statistics.median(r["answer_ms"] for r in runs)
    limit_ms = copy_ms + answer_ms
    return {
        **phases,
        "load_ms": load_ms,
        "weight_bytes": int(data.nbytes),
        "copy_ms": round(copy_ms, 2),
        "copy_gb_s": round(data.nbytes / copy_ms / 1e6, 2),
        "answer_ms": round(answer_ms, 2),
        "limit_ms": round(limit_ms, 2),
        "ratio": round(load_ms / limit_ms, 2),
        "to_route": to_route,
    }


def _phases(path: Any, config: Any) -> dict[str, float]:
    """One cold load, phase by phase, with the loader's functions; then a warm batch-1 answer."""
    import torch

    from failsoft.zoo.network import assign_weights, build_network, read_weights, weights_path

    weights = weights_path(path)
    batch = torch.zeros((1, *config.input_shape))
    out: dict[str, float] = {}
    state = _timed(out, "read_ms", lambda: read_weights(weights, "cpu"))
    module, forward = _timed(out, "skeleton_ms", lambda: build_network(config, on_meta=True))
    _timed(out, "assign_ms", lambda: assign_weights(module, state, weights))
    with torch.inference_mode():
        _timed(out, "first_answer_ms", lambda: forward(batch))
        answers: dict[str, float] = {}
        for i in range(3):
            _timed(answers, str(i), lambda: forward(batch))
    out["answer_ms"] = statistics.median(answers.values())
    return out


def _timed(out: dict[str, float], key: str, step: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = step()
    out[key] = (time.perf_counter() - started) * 1000.0
    return result


def _copy_ms(data: np.ndarray, repeats: int) -> float:
    """Milliseconds to copy ``data`` once into memory already allocated and touched (best run)."""
    target = np.empty_like(data)
    target[:] = 0
    best = float("inf")
    for _ in range(max(3, repeats)):
        started = time.perf_counter()
        np.copyto(target, data)
        best = min(best, (time.perf_counter() - started) * 1000.0)
    return best


def _to_route(repo: ModelRepository, family: str, variant: str, repeats: int) -> dict[str, Any]:
    """The recovery load to its route, before and after, in CPU ms (module docstring)."""
    from failsoft.policies.queueing import QueueParams, ServiceModel, warmup_budget_ms, warmup_sizes

    profile = repo.variant(family, variant)
    sizes = warmup_sizes(ServiceModel(profile), QueueParams().max_batch, warmup_budget_ms(profile.load_ms))
    path = repo.variant_dir(family, variant)
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    for i in range(repeats):  # alternated: a host getting busier weighs on both ways alike
        ways = [_before, _after] if i % 2 == 0 else [_after, _before]
        for way in ways:
            (before if way is _before else after).append(way(path, sizes))
    b = {k: round(statistics.median(r[k] for r in before), 2) for k in before[0]}
    a = {k: round(statistics.median(r[k] for r in after), 2) for k in after[0] if k != "warm_answer"}
    warm = statistics.median(r["warm_answer"] for r in after)
    return {
        "cpu_ms": {"before": b, "after": a},
        "ratio": round(a["total"] / b["total"], 2),
        "warmup_sizes": list(sizes),
        "first_answer_over_warm": round(a["first_answer"] / warm, 2),
        "warm_answer_cpu_ms": round(warm, 2),
        "profile_answer_ms": round(profile.latency_ms, 2),
        "skeleton_kib": _skeleton_kib(path),
    }


def _before(path: Any, sizes: tuple[int, ...]) -> dict[str, float]:
    """The recovery load as it was: skeleton built in the load, every warm-up size before the route."""
    from failsoft.zoo.layout import read_config
    from failsoft.zoo.network import build_network

    config = read_config(path)
    out: dict[str, float] = {}
    state = _cpu(out, "read", lambda: _read(path))
    module, forward = _cpu(out, "skeleton", lambda: build_network(config, on_meta=True))
    model = _cpu(out, "assign", lambda: _assign(config, path, module, forward, state))
    _cpu(out, "warm_up", lambda: _answer(model, sizes))
    out["total"] = sum(out.values())
    model.close()
    return out


def _after(path: Any, sizes: tuple[int, ...]) -> dict[str, float]:
    """The recovery load now: the skeleton prepared ahead and taken, the first answer, the rest of
    the warm-up after the route (timed apart, as is the skeleton's build)."""
    from failsoft.zoo.layout import read_config
    from failsoft.zoo.skeletons import Skeletons

    config = read_config(path)
    skeletons = Skeletons()
    out: dict[str, float] = {}
    _cpu(out, "skeleton_ahead", lambda: skeletons.build(config))
    state = _cpu(out, "read", lambda: _read(path))
    skeleton = _cpu(out, "skeleton", lambda: skeletons.take(config))
    assert skeleton is not None
    model = _cpu(out, "assign", lambda: _assign(config, path, skeleton.module, skeleton.forward, state))
    _cpu(out, "first_answer", lambda: _answer(model, sizes[:1]))
    out["total"] = out["read"] + out["skeleton"] + out["assign"] + out["first_answer"]
    _cpu(out, "warm_up_after_route", lambda: _answer(model, sizes[1:]))
    _cpu(out, "warm_answer", lambda: _answer(model, (1,)))
    model.close()
    return out


def _read(path: Any) -> Any:
    from failsoft.zoo.network import read_weights, weights_path

    return read_weights(weights_path(path), "cpu")


def _assign(config: Any, path: Any, module: Any, forward: Any, state: Any) -> Any:
    from failsoft.zoo.loaded import LoadedModel
    from failsoft.zoo.network import assign_weights, weights_path

    assign_weights(module, state, weights_path(path))
    c = config
    return LoadedModel(c.family, c.variant, "cpu", c.input_shape, c.num_classes, module, forward)


def _answer(model: Any, sizes: tuple[int, ...]) -> None:
    from failsoft.runtime.serving import warm_up

    warm_up(model.predict, model.input_shape, sizes)


def _cpu(out: dict[str, float], key: str, step: Callable[[], Any]) -> Any:
    """``step()``, its thread CPU milliseconds in ``out[key]`` (torch runs in this thread)."""
    started = time.thread_time()
    result = step()
    out[key] = (time.thread_time() - started) * 1000.0
    return result


def _skeleton_kib(path: Any) -> float:
    """What one skeleton takes in memory: the Python objects allocated building it (tracemalloc)."""
    from failsoft.zoo.layout import read_config
    from failsoft.zoo.network import build_network

    config = read_config(path)
    tracemalloc.start()
    try:
        kept = build_network(config, on_meta=True)
        kib = tracemalloc.get_traced_memory()[0] / 1024.0
    finally:
        tracemalloc.stop()
    del kept
    return round(kib, 1)
