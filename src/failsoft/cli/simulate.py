"""``failsoft simulate EXPERIMENT``: FailLite's experiments on the SimPy simulator.

Writes ``results.csv``, ``summary.json`` and ``EXPERIMENT.png`` into ``--out`` and prints a JSON
digest (the output paths and each policy's mean metrics) on stdout. A progress bar is drawn on
stderr when it is a terminal.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from failsoft.errors import ConfigError
from failsoft.sim import EXPERIMENTS, SimConfig, get_experiment, load_families, run_experiment, write_outputs
from failsoft.sim.deploy import DEFAULT_POLICIES, policy_labels
from failsoft.sim.output import summary
from failsoft.sim.runner import row_count

_DIGEST = ("recovery_rate", "mttr_ms", "accuracy_reduction_pct", "detection_ms", "plan_ms")


def simulate(
    experiment: Annotated[str, typer.Argument(help=f"One of: {', '.join(EXPERIMENTS)}", show_default=False)],
    out: Annotated[Path | None, typer.Option(help="Output directory [default: out/sim/EXPERIMENT]")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds 0..N-1 (clusters, failures, phases)")] = 3,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help=f"Repeatable; default all of: {', '.join(DEFAULT_POLICIES)}"),
    ] = None,
    failures: Annotated[
        int | None, typer.Option(min=0, help="Failure events per row (0: every server in turn)")
    ] = None,
    requests: Annotated[
        str | None,
        typer.Option(help="Per-request simulation: off, affected or all [default: per experiment]"),
    ] = None,
    load_slots: Annotated[int, typer.Option(min=1, help="Concurrent model loads per server")] = 1,
    charge_plan_time: Annotated[bool, typer.Option(help="Add the planner's wall time to MTTR")] = False,
    profiles: Annotated[Path | None, typer.Option(help="Profile CSV [default: bundled A2 profiles]")] = None,
    zoo: Annotated[Path | None, typer.Option(help="Model repository whose measured profiles to use")] = None,
) -> None:
    """Run a FailLite experiment (Figs. 7-11, 13) under every policy and seed; write CSV, JSON, PNG."""
    families = load_families(str(profiles) if profiles else None, str(zoo) if zoo else None)
    exp = get_experiment(experiment, families)
    policies = list(policy or DEFAULT_POLICIES)
    unknown = [p for p in policies if p not in policy_labels()]
    if unknown:
        raise ConfigError(f"unknown policy {unknown[0]!r} (known: {', '.join(policy_labels())})")
    config = _config(exp.config, requests, load_slots, charge_plan_time)
    total = row_count(exp, seeds, policies)
    with _progress(total, f"simulate {exp.name}") as advance:
        result = run_experiment(
            exp, families, seeds=seeds, policies=policies, failures=failures, config=config, on_row=advance
        )
    paths = write_outputs(result, out or Path("out") / "sim" / exp.name)
    typer.echo(json.dumps(_digest(summary(result), paths), indent=2))


def _config(base: SimConfig, requests: str | None, load_slots: int, charge: bool) -> SimConfig:
    changes: dict[str, Any] = {"load_slots": load_slots, "charge_plan_time": charge}
    if requests is not None:
        changes["requests"] = requests
    return dataclasses.replace(base, **changes)


def _digest(full: dict[str, Any], paths: dict[str, str]) -> dict[str, Any]:
    return {
        "experiment": full["experiment"],
        "figure": full["figure"],
        "seeds": len(full["seeds"]),
        "wall_s": full["wall_s"],
        "outputs": paths,
        "by_policy": {e["policy"]: {m: e[m]["mean"] for m in _DIGEST if m in e} for e in full["by_policy"]},
    }


class _progress:
    """A rich progress bar on a terminal's stderr; nothing otherwise."""

    def __init__(self, total: int, title: str) -> None:
        self.total, self.title = total, title
        self.bar = None

    def __enter__(self):
        if not sys.stderr.isatty():
            return lambda row: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task(self.title, total=self.total)
        return lambda row: self.bar.advance(task)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
