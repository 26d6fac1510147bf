"""``failsoft simulate llm-recovery`` and ``llm-recovery-sweep``: LUMEN's evaluation on the simulator.

=====================  ======================================================================
experiment             setup
=====================  ======================================================================
``llm-recovery``       4, 8, 16, 32 and 64 workers (Llama-2-70B, 4 H100s each), the Azure
                       conversation trace at 4 requests/s per worker, 25% of the workers killed
                       at once 40 s in (one of 4: the review's prototype; 16 of 64: its
                       "25% failures at scale"); every policy up to 16 workers, the three
                       headline ones (``lumen``, ``fixed-checkpointing``, ``stop-and-restart``)
                       at 32 and 64 (the ablations there would double the run time)
``llm-recovery-sweep`` ``lumen`` on 8 workers (2 killed), one parameter varied at a time around
                       the defaults: alpha, beta, theta, tau, draft_tokens, checkpoint budget,
                       and the draft's acceptance rate (a property of the draft model)
``llm-recovery-        the three headline policies on 8 workers (2 killed) under the Azure
workloads``            conversation and code traces and ShareGPT lengths (on the conversation
                       trace's arrival times), each at the same load relative to its estimated
                       capacity (:func:`~failsoft.sim.llm.data.capacity_per_worker`)
=====================  ======================================================================

Every (point, seed) also runs once without a failure (same arrivals): the baseline of
``recovery_ms``, reported as policy ``no-failure``. ``quick`` shrinks both to test size.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from failsoft.errors import ConfigError
from failsoft.policies import registry
from failsoft.services import LlmParams
from failsoft.sim.llm.cluster import LlmCluster, LlmSimConfig
from failsoft.sim.llm.data import WORKLOADS, capacity_per_worker
from failsoft.sim.llm.metrics import measure

HEADLINE = ("lumen", "fixed-checkpointing", "stop-and-restart")
ABLATIONS = ("lumen-no-load-aware", "lumen-no-locality", "lumen-no-progressive")
ALL_POLICIES = HEADLINE + ABLATIONS
BASELINE = "no-failure"
SCALES = (4, 8, 16, 32, 64)
ABLATION_MAX_WORKERS = 16
# The review's 4-worker prototype (Qwen3-32B): LUMEN against each baseline, percent.
REVIEW_4_WORKERS = {
    "stop-and-restart": {"ttft_ms_mean": -44.4, "tpot_ms_mean": -15.9, "recovery_ms": -50.0},
    "fixed-checkpointing": {"ttft_ms_mean": -7.1, "tpot_ms_mean": -7.0, "recovery_ms": -34.9},
}
SWEEP = {
    "alpha": (0.0, 0.25, 1.0, 4.0),
    "beta": (0.0, 1.0, 4.0),
    "theta": (1.0, 1.5, 2.0, 4.0),
    "tau": (8, 32, 128),
    "draft_tokens": (1, 2, 3, 4, 6),
    "checkpoint_budget_mb": (0.0, 5120.0, 10240.0, 20480.0, 40960.0),
    "acceptance": (0.3, 0.6, 0.8),
}
_SIM_AXES = ("acceptance",)  # a property of the draft model, set on the simulated cluster


@dataclass(frozen=True)
class LlmPoint:
    axis: str
    x: float
    label: str
    config: LlmSimConfig
    params: LlmParams
    policies: tuple[str, ...]


@dataclass(frozen=True)
class LlmExperiment:
    name: str
    title: str
    points: tuple[LlmPoint, ...]
    plot: str  # scale | sweep


@dataclass
class LlmResult:
    experiment: LlmExperiment
    rows: list[dict[str, Any]]
    seeds: list[int]
    wall_s: float
    policies: list[str] = field(default_factory=list)


def _quick(config: LlmSimConfig) -> LlmSimConfig:
    return dataclasses.replace(
        config, warmup_s=20.0, arrivals_after_s=40.0, window_s=30.0, target_load_s=10.0
    )


def _scale(quick: bool, policies: Sequence[str] | None) -> LlmExperiment:
    points = []
    for n in (4, 8) if quick else SCALES:
        config = LlmSimConfig(workers=n, failed=max(1, n // 4))
        chosen = tuple(policies) if policies else (ALL_POLICIES if n <= ABLATION_MAX_WORKERS else HEADLINE)
        points.append(
            LlmPoint("workers", n, str(n), _quick(config) if quick else config, LlmParams(), chosen)
        )
    return LlmExperiment(
        "llm-recovery",
        "LUMEN recovery: 25% of the workers fail (Azure conversation trace)",
        tuple(points),
        "scale",
    )


def _sweep(quick: bool, policies: Sequence[str] | None) -> LlmExperiment:
    base = LlmSimConfig(workers=8, failed=2)
    if quick:
        base = _quick(dataclasses.replace(base, workers=4, failed=1))
    chosen = tuple(policies) if policies else ("lumen",)
    points = []
    for axis, values in SWEEP.items():
        for value in values[:2] if quick else values:
            if axis in _SIM_AXES:
                config, params = dataclasses.replace(base, acceptance=float(value)), LlmParams()
            else:
                config, params = base, LlmParams(**{axis: type(getattr(LlmParams(), axis))(value)})
            points.append(LlmPoint(axis, float(value), f"{axis}={value:g}", config, params, chosen))
    return LlmExperiment(
        "llm-recovery-sweep", "LUMEN parameter sweep (8 workers, 2 fail)", tuple(points), "sweep"
    )


def _workloads(quick: bool, policies: Sequence[str] | None) -> LlmExperiment:
    base = LlmSimConfig(workers=8, failed=2)
    if quick:
        base = _quick(dataclasses.replace(base, workers=4, failed=1))
    chosen = tuple(policies) if policies else HEADLINE
    reference = capacity_per_worker("conv")
    points = []
    for i, workload in enumerate(WORKLOADS):
        rate = base.rate_per_worker * capacity_per_worker(workload) / reference  # the same relative load
        config = dataclasses.replace(base, workload=workload, rate_per_worker=round(rate, 3))
        points.append(LlmPoint("workload", float(i), workload, config, LlmParams(), chosen))
    return LlmExperiment(
        "llm-recovery-workloads", "LUMEN recovery by workload (8 workers, 2 fail)", tuple(points), "sweep"
    )


LLM_EXPERIMENTS: dict[str, Callable[[bool, Sequence[str] | None], LlmExperiment]] = {
    "llm-recovery": _scale,
    "llm-recovery-sweep": _sweep,
    "llm-recovery-workloads": _workloads,
}


def get_llm_experiment(
    name: str, quick: bool = False, policies: Sequence[str] | None = None
) -> LlmExperiment:
    if name not in LLM_EXPERIMENTS:
        raise ConfigError(f"unknown LLM experiment {name!r} (known: {', '.join(LLM_EXPERIMENTS)})")
    unknown = [p for p in policies or () if p not in ALL_POLICIES]
    if unknown:
        raise ConfigError(f"unknown llm recovery policy {unknown[0]!r} (known: {', '.join(ALL_POLICIES)})")
    return LLM_EXPERIMENTS[name](quick, policies)


def run_point(point: LlmPoint, policy: str, seed: int, baseline: LlmCluster | None = None) -> LlmCluster:
    """One run; ``policy`` ``no-failure`` runs without a failure (under stop-and-restart)."""
    if policy == BASELINE:
        config = dataclasses.replace(point.config, failed=0)
        return LlmCluster(config, registry.make("llm_recovery", "stop-and-restart", point.params), seed).run()
    return LlmCluster(point.config, registry.make("llm_recovery", policy, point.params), seed).run()


def run_llm_experiment(
    experiment: LlmExperiment, seeds: int = 1, on_row: Callable[[dict[str, Any]], None] | None = None
) -> LlmResult:
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    policies: list[str] = []
    baselines: dict[tuple[LlmSimConfig, int], LlmCluster] = {}
    for point in experiment.points:
        for seed in range(seeds):
            key = (dataclasses.replace(point.config, failed=0), seed)
            if key not in baselines:
                baselines[key] = run_point(point, BASELINE, seed)
                rows.append(_row(experiment, point, BASELINE, seed, measure(baselines[key])))
            for policy in point.policies:
                run = run_point(point, policy, seed)
                row = _row(experiment, point, policy, seed, measure(run, baselines[key]))
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            for p in (BASELINE, *point.policies):
                if p not in policies:
                    policies.append(p)
    return LlmResult(experiment, rows, list(range(seeds)), time.perf_counter() - started, policies)


def _row(
    experiment: LlmExperiment, point: LlmPoint, policy: str, seed: int, metrics: dict[str, Any]
) -> dict[str, Any]:
    return {
        "experiment": experiment.name,
        "policy": policy,
        "axis": point.axis,
        "x": point.x,
        "label": point.label,
        "seed": seed,
        "workers": point.config.workers,
        "failed_workers": 0 if policy == BASELINE else point.config.failed,
        **metrics,
    }


def headline(rows: Sequence[dict[str, Any]], workers: int = 4) -> dict[str, Any]:
    """LUMEN against each baseline at ``workers``, in percent (mean over seeds), beside the review's."""

    def mean(policy: str, metric: str) -> float:
        values = [
            r[metric]
            for r in rows
            if r["policy"] == policy and r["workers"] == workers and r["axis"] == "workers"
        ]
        finite = [v for v in values if isinstance(v, float | int) and math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan

    out: dict[str, Any] = {}
    for baseline, review in REVIEW_4_WORKERS.items():
        ours = {}
        for metric in review:
            base, lumen = mean(baseline, metric), mean("lumen", metric)
            ours[metric] = round(100 * (lumen - base) / base, 1) if base and math.isfinite(base) else None
        out[f"lumen_vs_{baseline}"] = {"ours_pct": ours, "review_pct": review}
    return out
