"""``failsoft bench fidelity CONFIG``: the same crash in the runtime and in the simulator, compared.

The simulator claims to twin the runtime: it runs the same orchestration core, the same policies
and the same failure detector, with time taken from measured profiles instead of real processes.
This benchmark checks the claim on a real crash:

1. **runtime**: the config is served on an embedded cluster (as ``bench failover`` does, with the
   config's own policy), steady client load runs, the chosen server is killed and, per affected app,
   the benchmark records FailLite's MTTR (detection to the new route published) and the first answer
   (detection to the first answer on the new route, as the gateway saw it);
2. **simulator**: the same deployment (the servers, primaries and the *warm backups the runtime
   actually had* at the kill) is simulated with the zoo's profiles of this machine (the load times,
   memory and per-batch latencies in the repository's ``profile.json`` files), the config's
   heartbeat, load slots and drain period, and the runtime's 5 ms health checks. A simulated first
   answer is its MTTR plus the first variant's profiled latency plus the serving path's overhead on
   this machine (gateway, Ray call, queue), measured in the same run as each affected app's usual
   latency minus its primary's profiled latency;
3. per app, ``|sim - runtime| / runtime``, and its median over the affected apps.

Printed: ``{"per_app": {APP: {"runtime_mttr_ms", "sim_mttr_ms", "runtime_first_answer_ms",
"sim_first_answer_ms", "kind", "first_variant"}}, "median_abs_error_pct": {"mttr", "first_answer"},
"abs_error_ms": {...}, ...}``. What the simulator leaves out is listed under ``not_modelled``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from failsoft.bench.failover import (
    BenchSettings,
    bench_config,
    ensure_families,
    run_once,
    victims,
)
from failsoft.domain import Scenario, WarmBackup
from failsoft.runtime.config import RuntimeConfig, load_config

Progress = Callable[[str], None]
CHECK_INTERVAL_S = 0.005  # the runtime controller's health-check tick
NOT_MODELLED = [
    "CPU contention between servers: on an embedded cluster every agent, the gateway and the clients "
    "share this machine's cores, so a load runs slower than its profile when others load or serve",
    "the controller's own processing time between detection and a published route (about a millisecond)",
    "Ray call and long-poll latencies (the first answer's overhead is measured, not simulated)",
    "garbage collection, page-cache state and thermal noise of the real machine",
]


def run(
    config_path: str | Path,
    kill: Sequence[str] = (),
    repeats: int = 3,
    sim_seeds: int = 20,
    progress: Progress | None = None,
) -> dict[str, Any]:
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    base = load_config(config_path)
    ensure_families(base, say)
    settings = BenchSettings(policies=(base.policy,), kill=tuple(kill), repeats=repeats)
    failed = victims(base, settings)
    runs = []
    for repeat in range(repeats):
        say(f"[fidelity] runtime run {repeat + 1}/{repeats}: killing {', '.join(failed)} ...")
        cfg = bench_config(base, base.policy)
        try:
            runs.append(run_once(cfg, failed, settings, say))
        finally:
            shutil.rmtree(cfg.state_dir, ignore_errors=True)
    say(f"[fidelity] simulating the same crash ({sim_seeds} seeds per runtime run) ...")
    sims = [simulate_run(base, r, failed, sim_seeds) for r in runs]
    return compare(str(config_path), failed, base.policy, runs, sims)


def simulate_run(config: RuntimeConfig, observed: dict[str, Any], failed: Sequence[str], seeds: int) -> dict:
    """The simulated counterpart of one runtime run: per app, mean simulated MTTR over ``seeds``."""
    from failsoft.policies.registry import get_failover_policy
    from failsoft.runtime.session import prepare
    from failsoft.sim import Deployment, RequestMode, SimConfig, simulate_failure

    scenario = _as_deployed(prepare(config).deployment, observed["warm"])
    deployment = Deployment(config.policy, get_failover_policy(config.policy), scenario, None)
    sim_config = SimConfig(
        heartbeat_interval_s=config.heartbeat.interval_s,
        missed_to_fail=config.heartbeat.missed_to_fail,
        check_interval_s=CHECK_INTERVAL_S,
        notify_ms=0.0,  # FailLite's MTTR ends when the route is published, as the runtime's does
        load_slots=config.agents.max_parallel_loads,
        drain_ms=config.agents.drain_ms,
        requests=RequestMode.OFF,
    )
    mttr: dict[str, list[float]] = {}
    for seed in range(seeds):
        event = simulate_failure(deployment, failed, sim_config, seed=seed)
        for app, record in event.apps.items():
            if record.recovered:
                mttr.setdefault(app, []).append(record.mttr_ms)
    first_variant = {}
    for app in scenario.apps:
        chosen = observed["apps"].get(app.name, {}).get("first_variant")
        if chosen is not None:
            first_variant[app.name] = scenario.variant_of(app, chosen)
    return {
        "mttr_ms": {app: statistics.fmean(v) for app, v in mttr.items()},
        "first_latency_ms": {app: v.latency_ms for app, v in first_variant.items()},
        "primary_latency_ms": {a.name: scenario.primary_variant(a).latency_ms for a in scenario.apps},
    }


def _as_deployed(deployment: Scenario, warm: Sequence[dict[str, str]]) -> Scenario:
    backups = tuple(WarmBackup(w["app"], w["variant"], w["server"]) for w in warm)
    return deployment.replace(warm=backups)


def compare(
    config: str, failed: Sequence[str], policy: str, runs: list[dict[str, Any]], sims: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per app, runtime and simulated MTTR and first answer (means over runs), and the errors."""
    per_app: dict[str, dict[str, Any]] = {}
    apps = sorted({a for r in runs for a in r["apps"]})
    overhead = _overhead_ms(runs, sims)
    for app in apps:
        rt = [r["apps"][app] for r in runs if app in r["apps"] and r["apps"][app]["recovered"]]
        sim_mttr = [s["mttr_ms"][app] for s in sims if app in s["mttr_ms"]]
        sim_first = [
            s["mttr_ms"][app] + s["first_latency_ms"][app] + overhead
            for s in sims
            if app in s["mttr_ms"] and app in s["first_latency_ms"]
        ]
        per_app[app] = {
            "kind": _mode([a["kind"] for a in rt]),
            "first_variant": _mode([a["first_variant"] for a in rt]),
            "runtime_mttr_ms": _mean([a["mttr_ms"] for a in rt]),
            "sim_mttr_ms": _mean(sim_mttr),
            "runtime_first_answer_ms": _mean([a["first_answer_ms"] for a in rt]),
            "sim_first_answer_ms": _mean(sim_first),
        }
    return {
        "config": config,
        "failed": list(failed),
        "policy": policy,
        "runs": len(runs),
        "per_app": per_app,
        "median_abs_error_pct": {k: _median_error(per_app, k) for k in ("mttr", "first_answer")},
        "abs_error_ms": {k: _abs_errors(per_app, k) for k in ("mttr", "first_answer")},
        "serving_overhead_ms": round(overhead, 2),
        "detection_ms": [round(v, 1) for r in runs for v in r["detection_ms"].values()],
        "failed_requests": sum(r["requests"]["failed"] for r in runs),
        "not_modelled": NOT_MODELLED,
    }


def _overhead_ms(runs: list[dict[str, Any]], sims: list[dict[str, Any]]) -> float:
    """The serving path's cost beyond the model on this machine: usual latency minus profiled."""
    samples = [
        a["usual_ms"] - s["primary_latency_ms"][app]
        for r, s in zip(runs, sims, strict=True)
        for app, a in r["apps"].items()
        if a.get("usual_ms") is not None
    ]
    return max(statistics.median(samples), 0.0) if samples else 0.0


def _errors(per_app: dict[str, dict[str, Any]], key: str) -> list[tuple[float, float]]:
    out = []
    for a in per_app.values():
        rt, sim = a[f"runtime_{key}_ms"], a[f"sim_{key}_ms"]
        if rt is not None and sim is not None and rt > 0:
            out.append((rt, sim))
    return out


def _median_error(per_app: dict[str, dict[str, Any]], key: str) -> float | None:
    errors = [abs(sim - rt) / rt * 100.0 for rt, sim in _errors(per_app, key)]
    return round(statistics.median(errors), 1) if errors else None


def _abs_errors(per_app: dict[str, dict[str, Any]], key: str) -> dict[str, float | None]:
    errors = [abs(sim - rt) for rt, sim in _errors(per_app, key)]
    if not errors:
        return {"median": None, "max": None}
    return {"median": round(statistics.median(errors), 1), "max": round(max(errors), 1)}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 2) if present else None


def _mode(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(set(present), key=present.count) if present else None
