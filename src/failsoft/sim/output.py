"""What ``failsoft simulate`` writes: ``results.csv``, ``summary.json`` and ``<experiment>.png``.

``results.csv`` has one row per (policy, x, seed) and starts with the columns ``experiment, policy,
axis, x, label, seed, recovery_rate, mttr_ms, accuracy_reduction_pct, detection_ms, outage_ms``;
the rest are described in ``docs/simulator.md``. Undefined values (an MTTR with nothing recovered)
are written as ``nan``. ``summary.json`` holds the setup and, per (policy, point) and per policy,
each metric's mean, standard deviation, min and max over the seeds.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError
from failsoft.sim.runner import KEY_COLUMNS, METRIC_COLUMNS, ExperimentResult, aggregate


def columns(rows: list[dict[str, Any]]) -> list[str]:
    first = [*KEY_COLUMNS, *METRIC_COLUMNS]
    rest = [c for row in rows for c in row if c not in first]
    return first + list(dict.fromkeys(rest))


def write_csv(result: ExperimentResult, path: Path) -> Path:
    return write_rows(result.rows, columns(result.rows), path)


def write_rows(rows: Sequence[dict[str, Any]], names: Sequence[str], path: Path) -> Path:
    """``rows`` as CSV with these columns (missing cells empty; floats rounded, NaN as "nan")."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(names), restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
    return path


def output_dir(out_dir: Path) -> Path:
    """``out_dir``, created if missing; a clear error if it cannot be."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create output directory {str(out_dir)!r}: {exc.strerror}") from exc
    return out_dir


def summary(result: ExperimentResult) -> dict[str, Any]:
    experiment = result.experiment
    return {
        "experiment": experiment.name,
        "figure": experiment.figure,
        "title": experiment.title,
        "policies": result.policies,
        "seeds": result.seeds,
        "failures_per_row": result.failures or "every server",
        "families": result.families,
        "config": {k: _json(v) for k, v in dataclasses.asdict(result.config).items()},
        "wall_s": round(result.wall_s, 3),
        "by_point": _clean(aggregate(result.rows, ("policy", "axis", "x", "label"))),
        "by_policy": _clean(aggregate(result.rows, ("policy",))),
    }


def write_outputs(result: ExperimentResult, out_dir: Path) -> dict[str, str]:
    """Write the CSV, the summary and the figure into ``out_dir``; return their paths."""
    from failsoft.sim.figures import plot  # matplotlib only when a figure is drawn

    return write_experiment(
        result.rows,
        columns(result.rows),
        summary(result),
        out_dir,
        f"{result.experiment.name}.png",
        lambda path: plot(result, path),
    )


def write_experiment(
    rows: Sequence[dict[str, Any]],
    names: Sequence[str],
    summary_doc: dict[str, Any],
    out_dir: Path,
    figure: str,
    plot: Callable[[Path], Any],
) -> dict[str, str]:
    """What every ``failsoft simulate`` experiment writes into ``out_dir``: ``results.csv`` (these
    rows and columns), ``summary.json`` (strict JSON: NaN and infinities as null) and the figure
    ``plot`` draws at ``out_dir / figure``. Returns the three paths."""
    csv_path = write_rows(rows, names, output_dir(out_dir) / "results.csv")
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(_clean(summary_doc), indent=2, allow_nan=False) + "\n")
    figure_path = out_dir / figure
    plot(figure_path)
    return {"csv": str(csv_path), "summary": str(summary_path), "figure": str(figure_path)}


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else round(value, 6)
    return value


def _json(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, floats are rounded."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return value
