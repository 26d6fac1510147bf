"""Figures in the style of FailLite's (matplotlib, Agg backend): one PNG per experiment.

* ``testbed`` (Fig. 7): recovery rate and MTTR per policy as bars, the accuracy reduction printed
  in the title, as the paper does;
* ``headroom``, ``criticality``, ``site-failure`` (Figs. 8, 9, 11): recovery rate, MTTR and accuracy
  reduction against the swept value, one line per policy;
* ``family`` (Fig. 10): the same three panels as grouped bars per family class;
* ``scalability`` (Fig. 13): planner time against servers, apps and variants.

Error bars are one standard deviation over the seeds (over seeds and failed servers for testbed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from failsoft.sim.runner import ExperimentResult, aggregate

NAMES = {
    "faillite": "FailLite (failsoft)",
    "faillite-paper": "FailLite (paper Alg. 1)",
    "full-warm": "Full-Warm",
    "full-cold": "Full-Cold",
    "full-warm-k": "Full-Warm(K)",
}
COLORS = {
    "faillite": "#1f77b4",
    "faillite-paper": "#17becf",
    "full-warm": "#ff7f0e",
    "full-cold": "#2ca02c",
    "full-warm-k": "#d62728",
}
PANELS = (
    ("recovery_rate", "Recovery Rate (%)", 100.0),
    ("mttr_ms", "MTTR (ms)", 1.0),
    ("accuracy_reduction_pct", "Accu. Reduction (%)", 1.0),
)


def plot(result: ExperimentResult, path: Path) -> Path:
    """Draw ``result``'s figure into ``path`` (PNG)."""
    kind = result.experiment.plot
    draw = {"testbed": _testbed, "bars": _grouped, "scalability": _scalability}.get(kind, _lines)
    fig = draw(result)
    fig.suptitle(f"{result.experiment.figure}: {result.experiment.title}", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend or a footnote
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _stat(entry: dict[str, Any], column: str, scale: float) -> tuple[float, float]:
    value = entry.get(column, {"mean": float("nan"), "std": 0.0})
    return value["mean"] * scale, value["std"] * scale


def _policy_entries(result: ExperimentResult) -> dict[str, list[dict[str, Any]]]:
    points = aggregate(result.rows, ("policy", "axis", "x", "label"))
    by_policy: dict[str, list[dict[str, Any]]] = {p: [] for p in result.policies}
    for entry in points:
        by_policy[entry["policy"]].append(entry)
    return by_policy


def _testbed(result: ExperimentResult):
    entries = aggregate(result.rows, ("policy",))
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, (column, ylabel, scale) in zip(axes, PANELS[:2], strict=True):
        for i, entry in enumerate(entries):
            mean, std = _stat(entry, column, scale)
            ax.bar(i, mean, yerr=std, color=COLORS.get(entry["policy"]), capsize=3)
        ax.set_xticks(range(len(entries)), [NAMES.get(e["policy"], e["policy"]) for e in entries])
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.set_ylabel(ylabel)
    loss = {e["policy"]: _stat(e, "accuracy_reduction_pct", 1.0)[0] for e in entries}
    text = "Accuracy reduction: " + ", ".join(f"{NAMES.get(p, p)} {v:.2f}%" for p, v in loss.items())
    fig.text(0.5, 0.01, text, ha="center", fontsize=7)
    return fig


def _lines(result: ExperimentResult):
    by_policy = _policy_entries(result)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, (column, ylabel, scale) in zip(axes, PANELS, strict=True):
        for policy, entries in by_policy.items():
            entries = _line(ax, policy, entries, column, scale)
            ax.set_xticks([e["x"] for e in entries], [e["label"] for e in entries])
        ax.set_xlabel(_axis_name(result))
        ax.set_ylabel(ylabel)
    _legend(fig, axes[0])
    return fig


def _grouped(result: ExperimentResult):
    by_policy = _policy_entries(result)
    labels = [p.label for p in result.experiment.points]
    width = 0.8 / max(len(by_policy), 1)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, (column, ylabel, scale) in zip(axes, PANELS, strict=True):
        for k, (policy, entries) in enumerate(by_policy.items()):
            stats = {e["label"]: _stat(e, column, scale) for e in entries}
            xs = [i + k * width for i in range(len(labels))]
            means = [stats.get(lab, (float("nan"), 0.0))[0] for lab in labels]
            stds = [stats.get(lab, (0.0, 0.0))[1] for lab in labels]
            ax.bar(xs, means, width, yerr=stds, label=NAMES.get(policy, policy), color=COLORS.get(policy))
        ax.set_xticks([i + width * (len(by_policy) - 1) / 2 for i in range(len(labels))], labels)
        ax.set_ylabel(ylabel)
    _legend(fig, axes[0])
    return fig


def _scalability(result: ExperimentResult):
    by_policy = _policy_entries(result)
    axes_names: Sequence[str] = list(dict.fromkeys(p.axis for p in result.experiment.points))
    fig, axes = plt.subplots(1, len(axes_names), figsize=(4 * len(axes_names), 3.2))
    for ax, axis in zip(axes, axes_names, strict=True):
        for policy, entries in by_policy.items():
            _line(ax, policy, [e for e in entries if e["axis"] == axis], "plan_ms", 1.0)
        ax.set_xlabel(f"number of {axis}")
        ax.set_ylabel("planner time (ms)")
    _legend(fig, axes[0])
    return fig


def _line(ax, policy: str, entries: list[dict[str, Any]], column: str, scale: float) -> list[dict[str, Any]]:
    """One policy's line with error bars, by increasing x; returns the entries in that order."""
    entries = sorted(entries, key=lambda e: e["x"])
    stats = [_stat(e, column, scale) for e in entries]
    ax.errorbar(
        [e["x"] for e in entries],
        [m for m, _ in stats],
        yerr=[s for _, s in stats],
        label=NAMES.get(policy, policy),
        color=COLORS.get(policy),
        marker="o",
        markersize=3,
        capsize=2,
    )
    return entries


def _legend(fig, ax) -> None:
    """One legend for the figure, in a row under the panels (it never hides a bar or a line)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)


def _axis_name(result: ExperimentResult) -> str:
    return result.experiment.points[0].axis if result.experiment.points else ""
