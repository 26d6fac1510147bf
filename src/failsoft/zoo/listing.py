"""The repository as rows and as a table (``failsoft zoo list``): one line per variant.

Each row shows what FailLite's planner weighs (section 3.2): weight size, memory when loaded, cold
load time, p50 latency at batch 1, and accuracy, marked ``measured`` (held-out split, here) or
``declared`` (published). A variant that is built but not profiled yet shows its size and accuracy
and dashes for the rest. MB is 2^20 bytes.
"""

from __future__ import annotations

from typing import Any

from failsoft.errors import RepositoryError
from failsoft.zoo.repository import ModelRepository

MIB = 2**20


def rows(repo: ModelRepository) -> list[dict[str, Any]]:
    """One dict per built variant, families sorted by name, variants by size."""
    out: list[dict[str, Any]] = []
    for fam in repo.family_names():
        fam_rows = [_row(repo, fam, var) for var in repo.variant_names(fam)]
        out += sorted(fam_rows, key=lambda r: (r["size_mb"], r["variant"]))
    return out


def _row(repo: ModelRepository, family: str, variant: str) -> dict[str, Any]:
    config = repo.config(family, variant)
    row: dict[str, Any] = {
        "family": family,
        "variant": variant,
        "parameters": config.parameters,
        "size_mb": round(config.weights_bytes / MIB, 3),
        "memory_mb": None,
        "load_ms": None,
        "load_cpu_ms": None,
        "warm_load_ms": None,
        "latency_p50_ms": None,
        "accuracy": config.accuracy.value,
        "accuracy_source": config.accuracy.source,
    }
    try:
        v = repo.variant(family, variant)
    except RepositoryError:
        return row  # not profiled yet
    measured = {"memory_mb": v.memory_mb, "load_ms": v.load_ms, "latency_p50_ms": v.latency_ms}
    return row | measured | {"load_cpu_ms": v.load_cpu_ms, "warm_load_ms": v.warm_load_ms}


def render_table(table: list[dict[str, Any]], title: str) -> None:
    """Print the rows as a rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for name in ("family", "variant"):
        t.add_column(name)
    for name in (
        "size MB",
        "memory MB",
        "load ms",
        "of it CPU",
        "warm load ms",
        "latency p50 ms",
        "accuracy",
    ):
        t.add_column(name, justify="right")
    for r in table:
        t.add_row(
            r["family"],
            r["variant"],
            f"{r['size_mb']:.1f}" if r["size_mb"] >= 1 else f"{r['size_mb']:.3f}",
            _num(r["memory_mb"], 1),
            _num(r["load_ms"], 1),
            _num(r["load_cpu_ms"], 1),
            _num(r["warm_load_ms"], 1),
            _num(r["latency_p50_ms"], 3 if (r["latency_p50_ms"] or 0) < 1 else 1),
            f"{r['accuracy']:.3f} {r['accuracy_source']}",
        )
    Console(width=max(130, Console().width)).print(t)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
