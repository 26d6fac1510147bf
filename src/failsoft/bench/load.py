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
"""

from __future__ import annotations

import statistics
import time
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
