"""Simulator speed, printed as JSON: ``python -m failsoft.sim.bench [--skip-headroom]``.

* ``headroom``: the whole headroom experiment (5 points x 5 policies, every server of the
  100-server cluster failed in turn, requests of the affected apps simulated) for one seed,
  wall time end to end (synthesis, warm-backup planning, simulation); target: under 60 s on 2 cores;
* ``large_event``: one failure event in a 1000-server, 3000-app cluster (10 sites), for a single
  server and for a whole site, under each policy: the wall time of ``simulate_failure`` alone
  (target: seconds) and of the set-up it needs (synthesis, ``plan_proactive``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from failsoft.domain import PolicyParams
from failsoft.sim.config import SimConfig
from failsoft.sim.deploy import DEFAULT_POLICIES, Deployer
from failsoft.sim.engine import simulate_failure
from failsoft.sim.experiments import get_experiment, load_families, testbed_families
from failsoft.sim.metrics import summarize
from failsoft.sim.runner import run_experiment
from failsoft.synth import ClusterShape, synthesize


def bench_headroom() -> dict[str, Any]:
    families = load_families()
    experiment = get_experiment("headroom", families)
    result = run_experiment(experiment, families, seeds=1)
    events = sum(int(r["events"]) for r in result.rows)
    return {
        "points": len(experiment.points),
        "policies": len(result.policies),
        "failure_events": events,
        "wall_s": round(result.wall_s, 2),
        "proactive_s": round(
            sum(r["proactive_ms"] for r in result.rows if r["policy"] != "faillite-paper") / 1000, 2
        ),
        "target_s": 60,
    }


def bench_large_event(servers: int = 1000, apps: int = 3000, seed: int = 0) -> dict[str, Any]:
    families = testbed_families(load_families())
    started = time.perf_counter()
    shape = ClusterShape(servers, 10, apps, headroom=0.2, policy=PolicyParams(ilp_time_limit_s=10.0))
    scenario = synthesize(families, shape, seed=seed)
    synth_s = time.perf_counter() - started
    site = scenario.sites[0].servers
    events = {"server": (scenario.servers[0].name,), "site": site}
    deployer = Deployer()
    out: dict[str, Any] = {
        "servers": servers,
        "apps": apps,
        "synthesize_s": round(synth_s, 2),
        "policies": {},
    }
    for label in DEFAULT_POLICIES:
        deployment = deployer.deploy(scenario, label)
        entry: dict[str, Any] = {
            "plan_proactive_s": round(deployment.proactive.solve_ms / 1000, 2) if deployment.proactive else 0
        }
        for kind, failed in events.items():
            started = time.perf_counter()
            event = simulate_failure(deployment, failed, SimConfig(), seed=seed)
            wall = time.perf_counter() - started
            metrics = summarize([event])
            entry[kind] = {
                "failed_servers": len(failed),
                "affected_apps": int(metrics["affected"]),
                "recovery_rate": round(metrics["recovery_rate"], 4),
                "plan_failover_ms": round(metrics["plan_ms"], 1),
                "simulate_s": round(wall, 3),
            }
        out["policies"][label] = entry
    out["target"] = "seconds per event"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-headroom", action="store_true")
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"benchmark": "sim"}
    if not args.skip_headroom:
        report["headroom"] = bench_headroom()
    if not args.skip_large:
        report["large_event"] = bench_large_event()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
