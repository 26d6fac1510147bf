"""Profiles into the ``families`` section of a scenario JSON, so planners run on measured numbers.

The scenario JSON (docs/scenario.md) describes each family as a list of variants with ``memory_mb``,
``accuracy``, ``load_ms`` and ``latency_ms`` (FailLite section 3.2's per-variant resource demand,
accuracy and latency). This module writes that section from either source of measurements:

* a model repository built and profiled on this machine (:class:`ModelRepository`), or
* a profile CSV such as the bundled A2 measurements (via :func:`failsoft.profiles.load_profile_families`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from failsoft.domain import Family, Variant
from failsoft.profiles import load_profile_families


def families_section(families: Iterable[Family]) -> dict[str, list[dict[str, Any]]]:
    """``{"family": [{"variant", "memory_mb", "accuracy", "load_ms", "latency_ms", ...}]}``, with
    ``batch_latency_ms``, ``load_cpu_ms`` and ``warm_load_ms`` where they were measured."""
    return {
        fam.name: [
            {
                "variant": v.name,
                "memory_mb": round(v.memory_mb, 3),
                "accuracy": round(v.accuracy, 6),
                "load_ms": round(v.load_ms, 3),
                "latency_ms": round(v.latency_ms, 4),
                "accuracy_source": v.accuracy_source,
            }
            | _optional(v)
            for v in fam.variants
        ]
        for fam in families
    }


def _optional(v: Variant) -> dict[str, Any]:
    """The measurements only a profiled zoo has: per-batch latency and the load's CPU/warm split."""
    out: dict[str, Any] = {}
    if v.batch_latency_ms:
        out["batch_latency_ms"] = {str(b): round(ms, 4) for b, ms in v.batch_latency_ms}
    for name in ("load_cpu_ms", "warm_load_ms"):
        if (value := getattr(v, name)) is not None:
            out[name] = round(value, 3)
    return out


def families_from_csv(
    path: str | Path | None = None, families: Iterable[str] | None = None
) -> tuple[Family, ...]:
    """Families from a profile CSV (the bundled A2 measurements when ``path`` is None)."""
    return load_profile_families(path, families)
