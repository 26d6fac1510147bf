"""``failsoft simulate EXPERIMENT``: FailLite's experiments on the SimPy simulator (and Jellyfish's
client sets, ``jellyfish``, and ParM's tail-latency figures, ``coding-tail``); ``model-loss`` twins
one model lost on a live server of a scenario JSON (``--scenario``, ``--server``, ``--app``) and
prints its record.

Writes ``results.csv``, ``summary.json`` and ``EXPERIMENT.png`` into ``--out`` and prints a JSON
digest (the output paths and each policy's mean metrics) on stdout. Progress goes to stderr: a bar
per experiment point on a terminal (each fills as its seeds and policies are done), otherwise one
line per point and seed; at the end, the paths of the files written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from failsoft.cli.progress import progress_bar
from failsoft.errors import ConfigError
from failsoft.sim import EXPERIMENTS, SimConfig, get_experiment, load_families, run_experiment, write_outputs
from failsoft.sim.deploy import DEFAULT_POLICIES, policy_labels
from failsoft.sim.output import summary
from failsoft.sim.runner import row_count

# failsoft.sim.llm, imported when one of these runs
_LLM_EXPERIMENTS = ("llm-recovery", "llm-recovery-sweep", "llm-recovery-workloads")
_NAMES = ", ".join([*EXPERIMENTS, "jellyfish", "coding-tail", "model-loss", *_LLM_EXPERIMENTS])

_DIGEST = ("recovery_rate", "mttr_ms", "accuracy_reduction_pct", "detection_ms", "plan_ms")


def simulate(
    experiment: Annotated[str, typer.Argument(help=f"One of: {_NAMES}", show_default=False)],
    out: Annotated[Path | None, typer.Option(help="Output directory (default: out/sim/EXPERIMENT)")] = None,
    seeds: Annotated[
        int | None, typer.Option(min=1, help="Seeds 0..N-1 (default 3; jellyfish, coding-tail, llm-*: 1)")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help=f"Repeatable; default all of: {', '.join(DEFAULT_POLICIES)}"),
    ] = None,
    failures: Annotated[
        int | None, typer.Option(min=0, help="Failure events per row (0: every server in turn)")
    ] = None,
    requests: Annotated[
        str | None,
        typer.Option(help="Per-request simulation: off, affected or all (default: per experiment)"),
    ] = None,
    load_slots: Annotated[int, typer.Option(min=1, help="Concurrent model loads per server")] = 1,
    charge_plan_time: Annotated[bool, typer.Option(help="Add the planner's wall time to MTTR")] = False,
    profiles: Annotated[Path | None, typer.Option(help="Profile CSV (default: bundled A2 profiles)")] = None,
    zoo: Annotated[Path | None, typer.Option(help="Model repository whose measured profiles to use")] = None,
    quick: Annotated[bool, typer.Option(help="llm-*, coding-tail: a small, test-sized run")] = False,
    slowdown: Annotated[
        float, typer.Option(min=0, help="coding-tail: slowdown of a query per background shuffle")
    ] = 1.0,
    fill_timeout_ms: Annotated[
        float | None, typer.Option(help="coding-tail: ParM's group fill timeout (default: the service's)")
    ] = None,
    fill: Annotated[
        str | None, typer.Option(help="coding-tail: fill timeout policy, rate or fixed (default: rate)")
    ] = None,
    scenario: Annotated[
        Path | None, typer.Option(help="model-loss: scenario JSON (docs/scenario.md), deployed by --policy")
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="model-loss: the live server that loses the model")
    ] = None,
    app: Annotated[str | None, typer.Option(help="model-loss: the app whose model it loses")] = None,
) -> None:
    """Run a FailLite experiment (Figs. 7-11, 13), Jellyfish's client sets or LUMEN's llm-recovery
    under every policy and seed; write CSV, JSON, PNG."""
    if experiment == "jellyfish":
        _jellyfish(out, seeds or 1, policy)
        return
    if experiment == "coding-tail":
        _coding_tail(out, seeds or 1, policy, quick, slowdown, fill_timeout_ms, fill)
        return
    if experiment == "model-loss":
        _model_loss(
            scenario,
            server,
            app,
            (policy or ["faillite"])[0],
            _config(SimConfig(), requests, load_slots, charge_plan_time),
        )
        return
    if experiment in _LLM_EXPERIMENTS:
        from failsoft.cli.simulate_llm import simulate_llm

        simulate_llm(experiment, out, seeds or 1, policy, quick)
        return
    seeds = seeds or 3
    families = load_families(str(profiles) if profiles else None, str(zoo) if zoo else None)
    exp = get_experiment(experiment, families)
    policies = list(policy or DEFAULT_POLICIES)
    unknown = [p for p in policies if p not in policy_labels()]
    if unknown:
        raise ConfigError(f"unknown policy {unknown[0]!r} (known: {', '.join(policy_labels())})")
    config = _config(exp.config, requests, load_slots, charge_plan_time)
    with PointProgress(exp, seeds, policies) as on_row:
        result = run_experiment(
            exp, families, seeds=seeds, policies=policies, failures=failures, config=config, on_row=on_row
        )
    paths = write_outputs(result, out or Path("out") / "sim" / exp.name)
    typer.echo(json.dumps(_digest(summary(result), paths), indent=2))
    typer.echo(
        f"simulate {exp.name}: {row_count(exp, seeds, policies)} rows in {result.wall_s:.1f} s; wrote\n"
        + "\n".join(f"  {path}" for path in paths.values()),
        err=True,
    )


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


class PointProgress:
    """Progress of an experiment by point, on stderr: a rich bar per point on a terminal, else one
    line each time a point is done for one seed (every policy run)."""

    def __init__(self, exp: Any, seeds: int, policies: Sequence[str]) -> None:
        self.exp, self.seeds, self.policies = exp, seeds, len(policies)
        self.names = {(p.axis, p.x): p.label or f"{p.axis}={p.x:g}" for p in exp.points}
        self.done: dict[tuple[str, float], int] = dict.fromkeys(self.names, 0)
        self.bar: Any = None
        self.tasks: dict[tuple[str, float], Any] = {}
        self.started = time.perf_counter()

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        if sys.stderr.isatty():
            self.bar = progress_bar(stderr=True)
            self.bar.start()
            total = self.seeds * self.policies
            for key, name in self.names.items():
                self.tasks[key] = self.bar.add_task(f"{self.exp.name} {name}", total=total)
        return self.on_row

    def on_row(self, row: dict[str, Any]) -> None:
        key = (row["axis"], row["x"])
        self.done[key] += 1
        if self.bar is not None:
            self.bar.advance(self.tasks[key])
        elif self.done[key] % self.policies == 0:
            index = list(self.names).index(key) + 1
            typer.echo(
                f"[{index}/{len(self.names)}] {self.exp.name} {self.names[key]}: seed {row['seed'] + 1} of "
                f"{self.seeds} done ({time.perf_counter() - self.started:.1f} s)",
                err=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _model_loss(
    scenario: Path | None, server: str | None, app: str | None, policy: str, config: SimConfig
) -> None:
    """One model lost on a live server, twinned (:func:`failsoft.sim.simulate_model_loss`): how the
    core recovers the app (``promoted``, ``warm`` or ``reload``) and its MTTR, as JSON."""
    from failsoft.scenario import load_scenario
    from failsoft.sim import Deployer, simulate_model_loss

    missing = [f"--{n}" for n, v in (("scenario", scenario), ("server", server), ("app", app)) if v is None]
    if missing:
        raise ConfigError(f"simulate model-loss needs {', '.join(missing)}")
    assert scenario is not None and server is not None and app is not None
    if policy not in policy_labels():
        raise ConfigError(f"unknown policy {policy!r} (known: {', '.join(policy_labels())})")
    deployment = Deployer().deploy(load_scenario(scenario), policy)
    record = simulate_model_loss(deployment, app, server, config).apps[app]
    final_ms = None if record.final_at is None else round((record.final_at - record.detected_at) * 1000.0, 3)
    typer.echo(
        json.dumps(
            {
                "app": app,
                "lost_on": server,
                "policy": policy,
                "recovery": record.recovery,
                "server": record.server,
                "variant": record.variant,
                "mttr_ms": round(record.mttr_ms, 3) if record.recovered else None,
                "time_to_final_ms": final_ms,
            },
            indent=2,
        )
    )


def _jellyfish(out: Path | None, seeds: int, policies: list[str] | None) -> None:
    """Jellyfish's client sets over the synthetic, WiFi and LTE traces (failsoft.sim.jellyfish)."""
    from failsoft.sim import jellyfish

    chosen = tuple(policies or jellyfish.POLICIES)
    unknown = [p for p in chosen if p not in jellyfish.POLICIES]
    if unknown:
        raise ConfigError(f"unknown policy {unknown[0]!r} (known: {', '.join(jellyfish.POLICIES)})")
    sweep = jellyfish.Sweep(policies=chosen, seeds=seeds)
    cfg = jellyfish.JellyfishSimConfig()
    started = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        typer.echo(
            f"jellyfish {row['trace']} {row['clients']}x{row['fps']}fps slo {row['slo_ms']} {row['policy']} "
            f"seed {row['seed']}: miss {100 * row['miss_rate']:.2f}% ({time.perf_counter() - started:.0f} s)",
            err=True,
        )

    rows = jellyfish.run_sweep(sweep, cfg, on_row)
    result = jellyfish.summarize(rows, cfg)
    paths = jellyfish.write_outputs(rows, result, out or Path("out") / "sim" / "jellyfish")
    typer.echo(json.dumps({**result, "outputs": paths}, indent=2))


def _coding_tail(
    out: Path | None,
    seeds: int,
    policies: list[str] | None,
    quick: bool,
    slowdown: float,
    fill_timeout_ms: float | None,
    fill: str | None = None,
) -> None:
    """ParM's tail-latency figures: ParM, Equal-Resources, no redundancy (failsoft.sim.coding_tail)."""
    from failsoft.sim import coding_tail as ct

    chosen = tuple(policies or ct.POLICIES)
    unknown = [p for p in chosen if p not in ct.POLICIES]
    if unknown:
        raise ConfigError(f"unknown policy {unknown[0]!r} (known: {', '.join(ct.POLICIES)})")
    changes: dict[str, Any] = {"slowdown_per_shuffle": slowdown}
    if fill_timeout_ms is not None:
        changes["fill_timeout_ms"] = fill_timeout_ms
    if fill is not None:
        from failsoft.policies.coding.fill import FILL_POLICIES

        if fill not in FILL_POLICIES:
            raise ConfigError(f"--fill must be one of {', '.join(FILL_POLICIES)}; got {fill!r}")
        changes["fill"] = fill
    cfg = dataclasses.replace(ct.QUICK if quick else ct.CodingTailConfig(), **changes)
    sweep = ct.Sweep(policies=chosen, seeds=seeds, rates_per_figure=2 if quick else None)
    started = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        typer.echo(
            f"coding-tail {row['figure']} k={row['k']} {row['rate_qps']:g} qps {row['shuffles']} shuffles "
            f"{row['policy']} seed {row['seed']}: p50 {row['latency_p50_ms']:.1f} ms, p99.9 "
            f"{row['latency_p999_ms']:.1f} ms ({time.perf_counter() - started:.0f} s)",
            err=True,
        )

    rows, costs = ct.run_sweep(sweep, cfg, on_row)
    result = ct.summarize(rows, cfg, costs, time.perf_counter() - started)
    paths = ct.write_outputs(rows, result, out or Path("out") / "sim" / "coding-tail")
    typer.echo(json.dumps({**result, "outputs": paths}, indent=2))
