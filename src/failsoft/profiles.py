"""Measured model families from a profile CSV: the numbers planners and the simulator run on.

The bundled ``data/profiles/model_profiles_with_accuracy.csv`` holds 52 torchvision ImageNet models in
10 families measured on an NVIDIA A2 (GPU memory, load time, latency), joined with the ImageNet top-1
accuracy torchvision declares (see ``data/profiles/PROVENANCE.md``). Rows whose needed measurement is
``0.0`` (not measured) are skipped, never guessed.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from failsoft.domain import Family, Variant
from failsoft.errors import ConfigError

PROFILE_CSV = "model_profiles_with_accuracy.csv"

# The five families of FailLite's testbed (5.1).
TESTBED_FAMILIES = ("mobilenet", "shufflenet", "convnext", "efficientnet", "regnet")


def bundled_profile_path() -> Path:
    return Path(str(resources.files("failsoft") / "data" / "profiles" / PROFILE_CSV))


def load_profile_families(
    path: str | Path | None = None, families: Iterable[str] | None = None
) -> tuple[Family, ...]:
    """Families from a profile CSV (the bundled A2 measurements by default), smallest variant first."""
    path = Path(path) if path is not None else bundled_profile_path()
    wanted = set(families) if families is not None else None
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read profile CSV {str(path)!r}: {exc.strerror or exc}") from exc
    required = (
        "model_variant",
        "model_family",
        "imagenet_top1",
        "gpu_mem_mb_A2",
        "onnx_load_ms_A2",
        "avg_latency_ms_A2",
    )
    if rows and (missing := [c for c in required if c not in rows[0]]):
        raise ConfigError(f"profile CSV {str(path)!r} lacks columns {missing}")
    by_family: dict[str, list[Variant]] = {}
    for line, row in enumerate(rows, start=2):
        family = row["model_family"]
        if wanted is not None and family not in wanted:
            continue
        try:
            memory, load, latency = (float(row[c]) for c in required[3:])
            accuracy = float(row["imagenet_top1"]) / 100.0
        except ValueError as exc:
            raise ConfigError(f"profile CSV {str(path)!r} line {line}: {exc}") from exc
        if min(memory, load, latency, accuracy) <= 0:
            continue  # not measured
        by_family.setdefault(family, []).append(
            Variant(row["model_variant"], memory, accuracy, load, latency, "declared")
        )
    if wanted is not None and (unknown := wanted - set(by_family)):
        raise ConfigError(f"profile CSV {str(path)!r} has no family {sorted(unknown)[0]!r}")
    return tuple(Family(name, tuple(variants)) for name, variants in by_family.items())


def trimmed(family: Family, n_variants: int) -> Family:
    """The family cut to ``n_variants`` spread evenly from smallest to largest (both kept)."""
    if n_variants >= len(family.variants):
        return family
    if n_variants == 1:
        return Family(family.name, (family.largest,))
    last = len(family.variants) - 1
    picks = sorted({round(i * last / (n_variants - 1)) for i in range(n_variants)})
    return Family(family.name, tuple(family.variants[i] for i in picks))
