"""What ``failsoft simulate llm-recovery[-sweep]`` writes: ``results.csv`` (one row per point, policy
and seed), ``summary.json`` (setup; per point and policy and per policy: mean, std, min, max over the
seeds; at 4 workers, LUMEN against each baseline beside the review's numbers) and a PNG."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from failsoft.sim.llm.experiment import LlmResult, headline
from failsoft.sim.output import _clean, output_dir, write_rows
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
    csv_path = write_rows(result.rows, names, output_dir(out_dir) / "results.csv")
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(llm_summary(result), indent=2, allow_nan=False) + "\n")
    figure = plot_llm(result, out_dir / f"{result.experiment.name}.png")
    return {"csv": str(csv_path), "summary": str(summary_path), "figure": str(figure)}
