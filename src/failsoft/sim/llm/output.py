"""What ``failsoft simulate llm-recovery[-sweep]`` writes: ``results.csv`` (one row per point, policy
and seed), ``summary.json`` (setup; per point and policy and per policy: mean, std, min, max over the
seeds; at 4 workers, LUMEN against each baseline beside the review's numbers) and a PNG."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from failsoft.sim.llm.experiment import LlmResult, headline
from failsoft.sim.output import _clean, write_experiment
from failsoft.sim.runner import aggregate


def llm_summary(result: LlmResult) -> dict[str, Any]:
    exp = result.experiment
    point = exp.points[0]
    out = {
        "experiment": exp.name,
        "title": exp.title,
        "policies": result.policies,
        "seeds": result.seeds,
        "config": {
            k: v for k, v in dataclasses.asdict(point.config).items() if k not in ("workers", "failed")
        },
        "params": dataclasses.asdict(point.params),
        "wall_s": round(result.wall_s, 3),
        "by_point": _clean(aggregate(result.rows, ("policy", "axis", "x", "label"))),
        "by_policy": _clean(aggregate(result.rows, ("policy",))),
    }
    if exp.plot == "scale":
        out["vs_review_4_workers"] = _clean(headline(result.rows))
    return out


def write_llm_outputs(result: LlmResult, out_dir: Path) -> dict[str, str]:
    from failsoft.sim.llm.figure import plot_llm  # matplotlib only when a figure is drawn

    names = list(dict.fromkeys(k for row in result.rows for k in row))
    return write_experiment(
        result.rows,
        names,
        llm_summary(result),
        out_dir,
        f"{result.experiment.name}.png",
        lambda path: plot_llm(result, path),
    )
