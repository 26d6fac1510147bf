"""``failsoft llm real-size SHAPE...``: reload time and KV bytes per token of real LLM shapes.

For each shape that fits this machine (its weights in the available memory, with a margin, and on
the disk) the random-weight model is built once (:func:`failsoft.llm.realsize.build_real_size`)
and reloaded ``repeats`` times each way, as a restarted worker whose process is already up (imports
done) reloads it (:func:`~failsoft.llm.realsize.load_real_size`):

``cold``  the shards dropped from the page cache first (``posix_fadvise``, after a sync): read
          from the disk;
``warm``  right after a cold load, the shards in the page cache (``resident`` says how much of
          them was: a model larger than half the memory cannot be both cached and loaded).

One forward of a few tokens checks the KV bytes per token against the formula. A shape that does
not fit is reported analytically, and its reload extrapolated from the read bandwidth measured on
the largest shape that was loaded (cold), and on the largest whose warm reloads found at least 90%
of the shards cached (warm), marked ``"analytic": true``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from failsoft.llm.realsize import (
    GIB,
    Shape,
    _rss_anon_bytes,
    build_real_size,
    evict,
    forward_kv_bytes_per_token,
    is_built,
    load_real_size,
    mem_available_bytes,
    shard_files,
    variant_dir,
)
from failsoft.zoo.pagecache import resident_fraction

MEMORY_MARGIN = 3 * GIB  # left to the rest of the machine while a model is loaded


def fits(shape: Shape, root: Path, dtype: str) -> str | None:
    """None when ``shape`` can be built and loaded here; else why not."""
    need = shape.weight_bytes(dtype)
    avail = mem_available_bytes()
    if avail is not None and need + MEMORY_MARGIN > avail:
        return (
            f"weights {need / GIB:.1f} GiB + {MEMORY_MARGIN / GIB:.0f} GiB margin > "
            f"{avail / GIB:.1f} GiB of available memory"
        )
    if not is_built(variant_dir(root, shape, dtype)):
        import shutil

        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        if need + GIB > free:
            return f"weights {need / GIB:.1f} GiB + 1 GiB > {free / GIB:.1f} GiB free on {root}"
    return None


def _one_load(where: Path, device: str, files: list[Path], cold: bool, kv_tokens: int) -> dict[str, Any]:
    if cold:
        evict(files)
    resident = resident_fraction(files)
    gc.collect()
    model, phases = load_real_size(where, device)
    rss = _rss_anon_bytes()
    row: dict[str, Any] = {"kind": "cold" if cold else "warm", "resident_before": resident, **phases}
    if rss is not None and device == "cpu":
        row["rss_anon_gib"] = round(rss / GIB, 3)  # the weights are in the process's own memory
    if kv_tokens > 0:
        row["kv"] = forward_kv_bytes_per_token(model, kv_tokens)
    del model
    gc.collect()
    return row


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return round(sum(vals) / len(vals), 1) if vals else None


def measure_shape(
    shape: Shape, root: Path, dtype: str, device: str, repeats: int, kv_tokens: int,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Build ``shape`` (once) and reload it ``repeats`` times cold and warm."""
    progress(f"{shape.name}: build ({shape.weight_bytes(dtype) / GIB:.2f} GiB in {dtype})")
    build = build_real_size(root, shape, dtype)
    where = variant_dir(root, shape, dtype)
    files = shard_files(where)
    loads: list[dict[str, Any]] = []
    for i in range(repeats):
        for cold in (True, False):
            progress(f"{shape.name}: reload {i + 1}/{repeats} {'cold' if cold else 'warm'}")
            loads.append(_one_load(where, device, files, cold, kv_tokens if not loads else 0))
    nbytes = shape.weight_bytes(dtype)
    summary: dict[str, Any] = {}
    for kind in ("cold", "warm"):
        rows = [r for r in loads if r["kind"] == kind]
        total, read = _mean(rows, "total_ms"), _mean(rows, "read_ms")
        summary[kind] = {
            "reload_ms_mean": total,
            "reload_ms_min": min(float(r["total_ms"]) for r in rows),
            "reload_ms_max": max(float(r["total_ms"]) for r in rows),
            "read_ms_mean": read,
            "read_gb_per_s": round(nbytes / 1e9 / (read / 1000), 3) if read else None,
            "resident_before_mean": _mean(rows, "resident_before"),
        }
    return {
        **shape.describe(dtype),
        "measured": True,
        "build": {k: v for k, v in build.items() if k != "shards"},
        "loads": loads,
        "kv_check": loads[0].get("kv"),
        "reload": summary,
    }


WARM_RESIDENT = 0.9  # a "warm" reload counts as one when this much of the shards was cached


def references(measured: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The measurement each kind of reload is extrapolated from: the largest shape loaded cold,
    and the largest whose warm reloads really found the shards in the page cache."""
    out: dict[str, dict[str, Any]] = {}
    by_size = sorted(measured, key=lambda r: int(r["weight_bytes"]), reverse=True)
    for kind in ("cold", "warm"):
        for r in by_size:
            rel = r["reload"][kind]
            cached = kind == "cold" or (rel["resident_before_mean"] or 0.0) >= WARM_RESIDENT
            if rel["read_gb_per_s"] and cached:
                out[kind] = r
                break
    return out


def extrapolate(shape: Shape, dtype: str, refs: dict[str, dict[str, Any]], why: str) -> dict[str, Any]:
    """``shape``'s reload at the read bandwidth measured on ``refs`` (analytic)."""
    out: dict[str, Any] = {**shape.describe(dtype), "measured": False, "why_not_measured": why}
    nbytes = shape.weight_bytes(dtype)
    out["reload"] = {
        kind: {
            "analytic": True,
            "from": ref["shape"]["name"],
            "read_gb_per_s": ref["reload"][kind]["read_gb_per_s"],
            "reload_ms": round(nbytes / 1e9 / ref["reload"][kind]["read_gb_per_s"] * 1000, 1),
        }
        for kind, ref in refs.items()
    }
    return out


def run(
    shapes: list[Shape], root: Path, dtype: str = "bfloat16", device: str = "cpu", repeats: int = 2,
    kv_tokens: int = 4, progress: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Measure every shape that fits, extrapolate the others from the largest one measured."""
    import os

    from failsoft.zoo.machine import machine_info

    began = time.perf_counter()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for shape in sorted(shapes, key=lambda s: s.parameters()):
        why = fits(shape, root, dtype)
        if why is not None:
            progress(f"{shape.name}: not measured here ({why})")
            skipped[shape.name] = why
            continue
        results[shape.name] = measure_shape(shape, root, dtype, device, repeats, kv_tokens, progress)
    refs = references([r for r in results.values() if r["measured"]])
    for shape in shapes:
        if shape.name in skipped:
            if refs:
                results[shape.name] = extrapolate(shape, dtype, refs, skipped[shape.name])
            else:
                results[shape.name] = {
                    **shape.describe(dtype),
                    "measured": False,
                    "why_not_measured": skipped[shape.name],
                }
    return {
        "dtype": dtype,
        "device": device,
        "repeats": repeats,
        "root": str(root),
        "machine": machine_info(device),
        "seconds": round(time.perf_counter() - began, 1),
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "shapes": {s.name: results[s.name] for s in shapes},
    }
