"""Running an experiment: every point x policy x seed, one row each, and the spread over seeds.

For each seed and point the runner synthesizes one cluster (the same for every policy), deploys
it under each policy (warm backups from the policy's own ``plan_proactive``), injects the point's
failure events one at a time into fresh simulations of that deployment, and pools the events into
one row of FailLite 5.1's metrics (:func:`failsoft.sim.metrics.summarize`). Failure events and the
heartbeat and health-check phases are drawn from the seed, so every policy meets the same failures
at the same instants.

Rows are deterministic for a fixed seed, except the wall-clock columns (:data:`WALL_COLUMNS`) and
wherever the warm-backup ILP stops at its time limit (its incumbent then depends on machine speed;
it does not at the sizes the tests use).
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from failsoft.domain import Family, Scenario
from failsoft.sim.config import SimConfig
from failsoft.sim.deploy import DEFAULT_POLICIES, Deployer, resolve
from failsoft.sim.engine import simulate_failure
from failsoft.sim.experiments import Experiment, Point
from failsoft.sim.metrics import summarize
from failsoft.synth import synthesize

KEY_COLUMNS = ("experiment", "policy", "axis", "x", "label", "seed")
METRIC_COLUMNS = ("recovery_rate", "mttr_ms", "accuracy_reduction_pct", "detection_ms", "outage_ms")
WALL_COLUMNS = ("plan_ms", "plan_max_ms", "proactive_ms", "sim_ms")  # measured wall time


@dataclass
class ExperimentResult:
    experiment: Experiment
    rows: list[dict[str, Any]]
    seeds: list[int]
    policies: list[str]
    failures: int
    config: SimConfig
    families: list[str]
    wall_s: float


def run_experiment(
    experiment: Experiment,
    families: Sequence[Family],
    *,
    seeds: int = 1,
    policies: Sequence[str] = DEFAULT_POLICIES,
    failures: int | None = None,
    config: SimConfig | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> ExperimentResult:
    """Run ``experiment`` for seeds ``0..seeds-1``; ``on_row`` is called as each row is done."""
    for label in policies:
        resolve(label)  # refuse an unknown policy before any work
    config = config or experiment.config
    n_failures = experiment.default_failures if failures is None else failures
    started = time.perf_counter()
    with few_collections():
        rows = _run_points(experiment, families, seeds, policies, n_failures, config, on_row)
    return ExperimentResult(
        experiment,
        rows,
        list(range(seeds)),
        list(policies),
        n_failures,
        config,
        sorted({f.name for point in experiment.points for f in experiment.families(families, point)}),
        time.perf_counter() - started,
    )


@contextmanager
def few_collections() -> Iterator[None]:
    """Python's cyclic collector, seldom: a sweep allocates millions of short-lived objects (events,
    requests) that reference counting frees, and the collector's passes over the long-lived ones
    (profiles, scenarios, the imports) cost a tenth of the run. Results are the same either way."""
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _run_points(
    experiment: Experiment,
    families: Sequence[Family],
    seeds: int,
    policies: Sequence[str],
    n_failures: int,
    config: SimConfig,
    on_row: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    deployer = Deployer()
    rows: list[dict[str, Any]] = []
    for seed in range(seeds):
        for point in experiment.points:
            fams = experiment.families(families, point)
            scenario = synthesize(fams, experiment.shape(point), seed=seed)
            rng = random.Random(f"{experiment.name}/{seed}/{point.axis}/{point.x}")
            events = experiment.failures(scenario, point, rng, n_failures)
            for label in policies:
                row = _run_row(experiment, scenario, point, seed, label, events, deployer, config)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


def row_count(experiment: Experiment, seeds: int, policies: Sequence[str]) -> int:
    return seeds * len(experiment.points) * len(policies)


def _run_row(
    experiment: Experiment,
    scenario: Scenario,
    point: Point,
    seed: int,
    label: str,
    events: list[tuple[str, ...]],
    deployer: Deployer,
    config: SimConfig,
) -> dict[str, Any]:
    deployment = deployer.deploy(scenario, label)
    started = time.perf_counter()
    results = [
        simulate_failure(deployment, failed, config, seed=f"{seed}/{i}") for i, failed in enumerate(events)
    ]
    sim_ms = (time.perf_counter() - started) * 1000.0 / max(len(events), 1)
    proactive = deployment.proactive
    row: dict[str, Any] = {
        "experiment": experiment.name,
        "policy": label,
        "axis": point.axis,
        "x": point.x,
        "label": point.label,
        "seed": seed,
        **summarize(results),
        "servers": len(scenario.servers),
        "apps": len(scenario.apps),
        "proactive_unplaced": len(proactive.unplaced) if proactive else 0,
        "proactive_ms": proactive.solve_ms if proactive else 0.0,
        "sim_ms": sim_ms,
    }
    return row


# ----------------------------------------------------------------------------------------------
# Spread over seeds.
# ----------------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, standard deviation (0 for one value), min and max of the finite values."""
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not finite:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return {
        "mean": statistics.fmean(finite),
        "std": std,
        "min": min(finite),
        "max": max(finite),
        "n": len(finite),
    }


def aggregate(rows: Sequence[dict[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """Rows grouped by the ``by`` columns, each numeric column as its :func:`spread`."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    out = []
    for key, members in groups.items():
        entry: dict[str, Any] = dict(zip(by, key, strict=True))
        for column, value in members[0].items():
            if column in KEY_COLUMNS or not isinstance(value, int | float):
                continue
            entry[column] = spread([m[column] for m in members])
        out.append(entry)
    return out
