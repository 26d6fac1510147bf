"""Jellyfish's scheduler against the exact optimum: ``failsoft bench adaptation-plan``.

Seeded random instances in the public code's style (section 7.6 of the paper): clients with a frame
rate of 15 or 25 fps, an SLO of 75, 100 or 150 ms and an uplink drawn uniformly from 7.5 to 50 Mbps,
1 ms round trip and 4 ms server overhead; workers of the EfficientNet B0-B7 ladder (bundled A2
profiles), batches up to 8. Each instance is planned by the heuristic (``jellyfish``: annealing over
the DP mapping, timed) and by the MILP (HiGHS, time-limited, started from the heuristic's plan). The
objective is eq. 2 per request (accuracy x frame rate over all clients, unserved ones 0), after the
served rate, which both maximise first.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from failsoft.adaptation_data import DEFAULT_BATCH_COST, efficientnet_ladder
from failsoft.policies.adaptation.exact import solve
from failsoft.policies.adaptation.model import ClientSnapshot, Ladder, Snapshot
from failsoft.policies.adaptation.network import latency_budgets_ms
from failsoft.policies.adaptation.selection import JellyfishPolicy

SIZES = ((2, 8), (4, 16), (8, 32))
SLOS_MS = (75.0, 100.0, 150.0)
FPS = (15.0, 25.0)
BANDWIDTH_MBPS = (7.5, 50.0)
RTT_MS = 1.0
OVERHEAD_MS = 4.0
TARGET_RATIO = 0.98
TARGET_MS = 100.0
REFERENCE_MS = 442.0  # the public implementation at 8 x 32 on this CPU


def instance(ladder: Ladder, workers: int, clients: int, seed: int) -> Snapshot:
    """A seeded random planning problem of ``workers`` x ``clients``."""
    rng = np.random.default_rng(seed)
    snapshot_clients = []
    for i in range(clients):
        slo = float(rng.choice(SLOS_MS))
        fps = float(rng.choice(FPS))
        kbps = float(rng.uniform(*BANDWIDTH_MBPS)) * 1000.0
        budgets = latency_budgets_ms(ladder, slo, fps, kbps, RTT_MS, OVERHEAD_MS)
        snapshot_clients.append(ClientSnapshot(f"c{i}", fps, budgets))
    return Snapshot(ladder, tuple(snapshot_clients), tuple(f"w{k}" for k in range(workers)))


@dataclass(frozen=True)
class Run:
    seed: int
    heuristic_ms: float
    heuristic_objective: float
    heuristic_served_fps: float
    milp_objective: float
    milp_served_fps: float
    milp_ms: float
    milp_optimal: bool
    mip_gap: float
    ratio: float
    ratio_to_bound: float


def one_run(ladder: Ladder, workers: int, clients: int, seed: int, milp_time_s: float) -> Run:
    snapshot = instance(ladder, workers, clients, seed)
    started = time.perf_counter()
    heuristic = JellyfishPolicy(seed).plan(snapshot)
    heuristic_ms = (time.perf_counter() - started) * 1000.0
    started = time.perf_counter()
    exact, result = solve(snapshot, milp_time_s, seed, start=heuristic)
    milp_ms = (time.perf_counter() - started) * 1000.0
    stats = dict(exact.stats)
    gap = stats["mip_gap"]
    return Run(
        seed=seed,
        heuristic_ms=round(heuristic_ms, 2),
        heuristic_objective=round(heuristic.accuracy, 6),
        heuristic_served_fps=heuristic.served_fps,
        milp_objective=round(exact.accuracy, 6),
        milp_served_fps=exact.served_fps,
        milp_ms=round(milp_ms, 1),
        milp_optimal=stats["optimal"] == "yes",
        mip_gap=float(gap) if isinstance(gap, float | int) else 0.0,
        ratio=round(heuristic.accuracy / exact.accuracy, 6) if exact.accuracy else 1.0,
        ratio_to_bound=round(heuristic.accuracy / _bound(result.dual_bound, snapshot), 6),
    )


def bench_size(ladder: Ladder, workers: int, clients: int, seeds: int, milp_time_s: float) -> dict[str, Any]:
    runs = [one_run(ladder, workers, clients, seed, milp_time_s) for seed in range(seeds)]
    times = [r.heuristic_ms for r in runs]
    return {
        "workers": workers,
        "clients": clients,
        "instances": seeds,
        "heuristic_ms": round(statistics.median(times), 2),
        "heuristic_ms_max": max(times),
        "heuristic_objective": round(statistics.mean(r.heuristic_objective for r in runs), 6),
        "milp_objective": round(statistics.mean(r.milp_objective for r in runs), 6),
        "ratio": min(r.ratio for r in runs),
        "ratio_mean": round(statistics.mean(r.ratio for r in runs), 6),
        "ratio_to_bound": min(r.ratio_to_bound for r in runs),
        "milp_optimal": sum(r.milp_optimal for r in runs),
        "mip_gap_max": max(r.mip_gap for r in runs),
        "runs": [asdict(r) for r in runs],
    }


def _bound(dual_bound: float, snapshot: Snapshot) -> float:
    """The MILP's second-stage dual bound as accuracy per request (its objective is not normalised)."""
    return dual_bound / snapshot.total_fps if snapshot.total_fps else 1.0


def run(seeds: int = 3, milp_time_s: float = 20.0, max_batch: int = 8) -> dict[str, Any]:
    ladder = efficientnet_ladder(max_batch)
    sizes = [bench_size(ladder, k, n, seeds, milp_time_s) for k, n in SIZES]
    largest = sizes[-1]
    return {
        "ladder": {
            "family": "efficientnet_b0..b7 (A2 profiles)",
            "variants": [r.name for r in ladder.rungs],
            "max_batch": max_batch,
            "batch_cost": round(DEFAULT_BATCH_COST, 4),
        },
        "instances": {
            "slo_ms": list(SLOS_MS),
            "fps": list(FPS),
            "bandwidth_mbps": list(BANDWIDTH_MBPS),
            "rtt_ms": RTT_MS,
            "overhead_ms": OVERHEAD_MS,
            "milp_time_limit_s": milp_time_s,
        },
        "sizes": sizes,
        "targets": {
            "ratio": TARGET_RATIO,
            "heuristic_ms_at_8x32": TARGET_MS,
            "reference_ms_at_8x32": REFERENCE_MS,
            "met": bool(
                all(s["ratio"] >= TARGET_RATIO for s in sizes) and largest["heuristic_ms"] <= TARGET_MS
            ),
        },
    }
