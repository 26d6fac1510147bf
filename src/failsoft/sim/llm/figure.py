"""The LLM recovery figures: mean TTFT, mean TPOT and recovery time per policy against the cluster
size (``llm-recovery``), or LUMEN's TTFT and recovery time against each swept parameter."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from failsoft.sim.llm.experiment import BASELINE, LlmResult
from failsoft.sim.runner import aggregate

_METRICS = (
    ("ttft_ms_mean", "mean TTFT (s)"),
    ("tpot_ms_mean", "mean TPOT (ms)"),
    ("recovery_ms", "recovery (s)"),
)
_SCALE = {"ttft_ms_mean": 1e-3, "tpot_ms_mean": 1.0, "recovery_ms": 1e-3}


def plot_llm(result: LlmResult, path: Path) -> Path:
    entries = aggregate(result.rows, ("policy", "axis", "x"))
    if result.experiment.plot == "scale":
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for ax, (metric, name) in zip(axes, _METRICS, strict=True):
            for i, policy in enumerate(result.policies):
                if policy == BASELINE and metric == "recovery_ms":
                    continue
                pts = sorted((e["x"], e[metric]["mean"]) for e in entries if e["policy"] == policy)
                pts = [(x, y * _SCALE[metric]) for x, y in pts if y is not None and y == y]
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        marker="o",
                        color=f"C{i}",
                        label=policy,
                        linestyle="--" if policy.startswith("lumen-") or policy == BASELINE else "-",
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers (25% fail)")
            ax.set_ylabel(name)
        axes[0].legend(fontsize=7)
    else:
        axes_names = list(dict.fromkeys(e["axis"] for e in entries))
        fig, grid = plt.subplots(2, len(axes_names), figsize=(3 * len(axes_names), 6), squeeze=False)
        for col, axis in enumerate(axes_names):
            for row, metric in enumerate(("ttft_ms_mean", "recovery_ms")):
                ax = grid[row][col]
                for policy in result.policies:
                    if policy == BASELINE:
                        continue
                    pts = sorted(
                        (e["x"], e[metric]["mean"])
                        for e in entries
                        if e["policy"] == policy and e["axis"] == axis
                    )
                    pts = [(x, y * _SCALE[metric]) for x, y in pts if y is not None and y == y]
                    if pts:
                        ax.plot(*zip(*pts, strict=True), marker="o", label=policy)
                ax.set_xlabel(axis)
                ax.set_ylabel(dict(_METRICS)[metric])
    fig.suptitle(result.experiment.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
