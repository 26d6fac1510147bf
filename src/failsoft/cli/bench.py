"""``failsoft bench``: benchmarks that print JSON."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Benchmarks; each prints one JSON object.", no_args_is_help=True)


@app.command("plan")
def plan(
    repeats: Annotated[int, typer.Option(min=1, help="Timed repetitions of the heuristic")] = 5,
    seeds: Annotated[int, typer.Option(min=1, help="Random clusters for the ILP")] = 3,
) -> None:
    """Progressive heuristic at 1000 servers x 3000 apps x 4 variants; ILP gap at 100 x 640."""
    from failsoft.bench.plan import run

    typer.echo(json.dumps(run(repeats=repeats, seeds=seeds), indent=2))


@app.command("failover")
def failover(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/bench.yaml", show_default=False)
    ],
    policy: Annotated[
        list[str] | None, typer.Option("--policy", "-p", help="Policy to run (repeatable; default: all four)")
    ] = None,
    kill: Annotated[
        list[str] | None, typer.Option("--kill", help="Server to kill (repeatable; default: the busiest)")
    ] = None,
    site: Annotated[str | None, typer.Option(help="Kill every server of this site instead")] = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Fresh deployments per policy")] = 3,
    window_s: Annotated[float, typer.Option(min=1, max=600, help="Seconds apps get to recover")] = 30.0,
    hold_ms: Annotated[
        float,
        typer.Option(
            min=0, max=5000, help="Slow the servers to kill this long first: requests in flight at the kill"
        ),
    ] = 300.0,
) -> None:
    """Kill the same server(s) under each failover policy; detection, MTTR, outage, recovery, accuracy."""
    from failsoft.bench.failover import POLICIES, BenchSettings, run

    settings = BenchSettings(
        policies=tuple(policy or POLICIES),
        kill=tuple(kill or ()),
        site=site,
        repeats=repeats,
        window_s=window_s,
        hold_ms=hold_ms,
    )
    typer.echo(json.dumps(run(config, settings), indent=2))


# bench fidelity's and fidelity-set's --control-from (the host's control cost: calibrate_control)
ControlFrom = Annotated[
    list[Path] | None,
    typer.Option(
        "--control-from",
        help="Take the control path's cost as the host's constant: the median of what the probes "
        "of the bench.yaml and fidelity.yaml runs in these outputs (of bench fidelity or "
        "fidelity-set) fit (repeatable; default: each run's own probe)",
    ),
]


@app.command("fidelity")
def fidelity(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/bench.yaml", show_default=False)
    ],
    kill: Annotated[
        list[str] | None, typer.Option("--kill", help="Server to kill (repeatable; default: the busiest)")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Runtime runs (fresh deployments)")] = 3,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Simulated events per runtime run")] = 20,
    replay: Annotated[
        list[Path] | None,
        typer.Option(
            help="Compare again with the runtime runs of earlier outputs, pooled (repeatable; no "
            "cluster started)"
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="What the twin is told of the host's other work (default: steady): steady (busy "
            "cores before the kill), probe (a Python spin's share of a core before the kill), pin "
            "(the share a heavy probe load got under the steady load) or recovery (busy cores "
            "during the recovery)"
        ),
    ] = None,
    page_cache: Annotated[
        str,
        typer.Option(
            help="The weights at the kill: warm (read into memory before the cluster starts) or cold "
            "(dropped from the page cache once it is up: failover loads read the disk)"
        ),
    ] = "warm",
    control: Annotated[
        str | None,
        typer.Option(
            help="How the twin spends the control path's cost (default: ahead): ahead (CPU work run "
            "ahead of the loads, as short jobs that woke: slower only beside other control work), "
            "work (CPU work at its fair share, slower when more runs beside it) or wait (a fixed "
            "wait, no core taken)"
        ),
    ] = None,
    control_from: ControlFrom = None,
) -> None:
    """The same crash in the runtime and in the simulator: per-app MTTR and first answer, and the error."""
    from failsoft.bench.failover import PAGE_CACHE_STATES
    from failsoft.bench.fidelity import (
        CONTROL_MODELS,
        DEFAULT_CONTROL_MODEL,
        DEFAULT_HOST_MODEL,
        HOST_MODELS,
        replayed,
        run,
    )

    host = _one_of(host or DEFAULT_HOST_MODEL, HOST_MODELS, "--host")
    control = _one_of(control or DEFAULT_CONTROL_MODEL, CONTROL_MODELS, "--control")
    _one_of(page_cache, PAGE_CACHE_STATES, "--page-cache")
    earlier = replayed(*replay) if replay else None
    calibration = _control_calibration(control_from, Path("."), host, control)
    result = run(
        config, kill=tuple(kill or ()), repeats=repeats, sim_seeds=seeds, runs=earlier, host=host,
        page_cache=page_cache, control=control, host_control_ms=_ms(calibration),
    )  # fmt: skip
    if calibration:
        result["control_calibration"] = calibration
    typer.echo(json.dumps(result, indent=2))


@app.command("fidelity-set")
def fidelity_set(
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Only the set's configs whose file name contains this (repeatable)"),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Runtime runs per config")] = 3,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Simulated events per runtime run")] = 20,
    settle_s: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds to wait for the load to fall before each config")
    ] = 60.0,
    root: Annotated[Path, typer.Option(help="The checkout whose examples/ holds the set")] = Path("."),
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
    replay: Annotated[
        Path | None,
        typer.Option(help="Simulate again the runtime runs of an earlier output (no cluster started)"),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="The twin's host model, as bench fidelity --host (default: its default)"),
    ] = None,
    control: Annotated[
        str | None,
        typer.Option(help="The twin's control model, as bench fidelity --control (default: its default)"),
    ] = None,
    control_from: ControlFrom = None,
) -> None:
    """bench fidelity on the whole fidelity set: the median MTTR error per config, beside the host's
    load when it ran (a busy run is flagged, never reported as a figure)."""
    from failsoft.bench.fidelity import CONTROL_MODELS, DEFAULT_CONTROL_MODEL, DEFAULT_HOST_MODEL, HOST_MODELS
    from failsoft.bench.fidelity_set import run_set

    host = None if host is None else _one_of(host, HOST_MODELS, "--host")
    control = None if control is None else _one_of(control, CONTROL_MODELS, "--control")
    calibration = _control_calibration(
        control_from, root, host or DEFAULT_HOST_MODEL, control or DEFAULT_CONTROL_MODEL
    )
    earlier = None
    if replay is not None:
        try:
            earlier = json.loads(replay.read_text())
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(f"cannot read {str(replay)!r}: {exc}", param_hint="--replay") from exc
    result = run_set(
        root, only=tuple(only or ()), repeats=repeats, sim_seeds=seeds, settle_s=settle_s, progress=_progress,
        replay=earlier, host=host, control=control, host_control_ms=_ms(calibration),
    )  # fmt: skip
    if calibration:
        result["control_calibration"] = calibration
    _emit(result, out)


def _ms(calibration: dict[str, Any] | None) -> float | None:
    return None if calibration is None else float(calibration["ms"])


def _control_calibration(
    paths: list[Path] | None, root: Path, host: str, control: str
) -> dict[str, Any] | None:
    """``--control-from``: the control path's cost calibrated on the runs of those outputs."""
    if not paths:
        return None
    from failsoft.bench.fidelity import calibrate_control
    from failsoft.runtime.config import load_config

    outputs = []
    for path in paths:
        try:
            outputs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            problem = f"cannot read {str(path)!r}: {exc}"
            raise typer.BadParameter(problem, param_hint="--control-from") from exc
    return calibrate_control(outputs, lambda config: load_config(root / config), host, control)


def _one_of(value: str, choices: Sequence[str], option: str) -> str:
    """``value``, when ``option`` takes it (one of ``choices``); else a usage error naming them."""
    if value not in choices:
        raise typer.BadParameter(f"must be one of {', '.join(choices)}; got {value!r}", param_hint=option)
    return value


@app.command("adaptation")
def adaptation(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML) with one slo service, e.g. examples/slo.yaml")
    ],
    trace: Annotated[
        str, typer.Option(help="Bandwidth trace the clients replay: synthetic, wifi or lte")
    ] = "wifi",
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="jellyfish, edf-small, edf-medium, edf-large (repeatable; default: all)"
        ),
    ] = None,
    clients: Annotated[int, typer.Option(help="The paper's client set: 1, 2, 4 or 8 clients")] = 4,
    fps: Annotated[str, typer.Option(help="Client set frame rate: 15, 25 or var")] = "15",
    slo: Annotated[str, typer.Option(help="Client set SLO (ms): 75, 100, 150 or var")] = "100",
    duration_s: Annotated[float, typer.Option(min=1, max=600, help="Measured seconds per policy")] = 30.0,
    warmup_s: Annotated[float, typer.Option(min=0, max=120, help="Unmeasured seconds first")] = 5.0,
    root: Annotated[str | None, typer.Option(help="Model repository (default: the config's)")] = None,
    seed: Annotated[int, typer.Option(help="Trace offsets seed")] = 0,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """Jellyfish vs Clockwork-style EDF baselines on a real slo service, clients replaying a trace."""
    from failsoft.bench.adaptation import POLICIES, AdaptationBenchSettings, run

    settings = AdaptationBenchSettings(
        trace=trace, policies=tuple(policy or POLICIES), clients=clients, fps=fps, slo=slo,
        duration_s=duration_s, warmup_s=warmup_s, seed=seed, root=root,
    )  # fmt: skip
    _emit(run(config, settings, progress=_progress), out)


@app.command("adaptation-plan")
def adaptation_plan(
    seeds: Annotated[int, typer.Option(min=1, max=100, help="Random instances per size")] = 3,
    milp_time_s: Annotated[
        float, typer.Option(min=1, max=600, help="HiGHS time limit per instance (s), over its two stages")
    ] = 20.0,
) -> None:
    """Jellyfish's scheduler (annealing + DP) against the exact MILP, up to 8 workers x 32 clients."""
    from failsoft.bench.adaptation_plan import run

    typer.echo(json.dumps(run(seeds=seeds, milp_time_s=milp_time_s), indent=2))


@app.command("coding")
def coding(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML) with one coded service, e.g. examples/coded.yaml")
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="parm, equal-resources, none (repeatable; default: all three)"),
    ] = None,
    duration_s: Annotated[float, typer.Option(min=1, max=600, help="Seconds of load per policy")] = 24.0,
    rate_rps: Annotated[
        list[str] | None,
        typer.Option(help="Open-loop request rate, 1..1000 (repeatable: a sweep; default 20)"),
    ] = None,
    slow_ms: Annotated[
        list[str] | None,
        typer.Option(help="Straggler's added ms per batch, 0..10000 (repeatable: a sweep; default 50)"),
    ] = None,
    shuffle_s: Annotated[float, typer.Option(min=0.05, max=60, help="New straggler this often")] = 1.0,
    stragglers: Annotated[
        int, typer.Option(min=1, max=4, help="Servers slowed at once (2: a random pair, as a shuffle)")
    ] = 1,
    fill_timeout_ms: Annotated[
        float | None,
        typer.Option(min=1, max=10_000, help="The coded service's longest group wait (default: its own)"),
    ] = None,
    failover: Annotated[bool, typer.Option(help="Kill data member 1's server under load at the end")] = True,
    root: Annotated[str | None, typer.Option(help="Model repository (default: the config's)")] = None,
    seed: Annotated[int, typer.Option(help="Load and straggler seed")] = 0,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """ParM vs Equal-Resources vs no redundancy under shuffled stragglers; a killed member with no outage.

    Several --rate-rps or --slow-ms values make a sweep: every rate with every straggler level, on
    one cluster, each level a full run of the policies; a line per level goes to stderr.
    """
    from failsoft.bench.coding import POLICIES, CodingBenchSettings, run, sweep_levels

    levels = sweep_levels(rate_rps or ["20"], slow_ms or ["50"])  # names a bad value (exit 2)
    (rate, slow), swept = levels[0], len(levels) > 1
    settings = CodingBenchSettings(
        policies=tuple(policy or POLICIES), duration_s=duration_s, rate_rps=rate, slow_ms=slow,
        shuffle_s=shuffle_s, failover=failover, root=root, seed=seed, stragglers=stragglers,
        fill_timeout_ms=fill_timeout_ms, sweep=levels if swept else (),
    )  # fmt: skip
    _emit(run(config, settings, progress=_progress), out)


@app.command("llm")
def llm(
    config: Annotated[Path, typer.Argument(help="A config with an llm service (examples/llm.yaml)")],
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="llm_recovery policies (repeatable; default: lumen, fixed-checkpointing, stop-and-restart)",
        ),
    ] = None,
    requests: Annotated[int, typer.Option(min=1, max=10_000, help="Requests replayed per policy")] = 40,
    rate_rps: Annotated[float, typer.Option(min=0.1, max=1000, help="Mean arrival rate")] = 8.0,
    kill_at_s: Annotated[float, typer.Option(min=0, max=600, help="When the busiest worker is killed")] = 2.0,
    slow_ms: Annotated[float, typer.Option(min=0, max=10_000, help="Added ms per engine step")] = 10.0,
    seed: Annotated[int, typer.Option(help="Trace window and prompt seed")] = 0,
    reload_ms: Annotated[
        float,
        typer.Option(
            min=0,
            max=600_000,
            help="Added to the restarted worker's target load (a larger model's: see failsoft llm real-size)",
        ),
    ] = 0.0,
    rounds: Annotated[
        int, typer.Option(min=1, max=100, help="Rounds of a reference and every policy (order rotated)")
    ] = 1,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """LUMEN vs Fixed-Checkpointing vs Stop-and-Restart on a real llm service, one worker killed."""
    from failsoft.bench.llm import POLICIES, LlmBenchSettings, run

    settings = LlmBenchSettings(
        tuple(policy or POLICIES), requests, rate_rps, kill_at_s, slow_ms, seed, reload_ms, rounds
    )
    save = None if out is None else functools.partial(_write_json, out=out)  # after every run
    _emit(run(config, settings, progress=_progress, save=save), out)


@app.command("llm-engine")
def llm_engine(
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Timed runs per way (medians)")] = 5,
    threads: Annotated[int, typer.Option(min=1, max=256, help="torch threads, the same for every way")] = 1,
    new_tokens: Annotated[int, typer.Option(min=1, max=4000, help="Tokens generated per request")] = 64,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """The LLM engine's tokens/s on a tiny random Llama: batch 1 vs generate, 8 requests vs 1."""
    from failsoft.bench.llm_engine import EngineBenchSettings, run

    _emit(run(EngineBenchSettings(new_tokens=new_tokens, repeats=repeats, threads=threads)), out)


@app.command("load")
def load(
    variants: Annotated[list[str], typer.Argument(help="family/variant, one or more", show_default=False)],
    root: Annotated[Path | None, typer.Option(help="Model repository (default: the zoo's)")] = None,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Cold loads per variant (medians)")] = 5,
    threads: Annotated[int, typer.Option(min=1, max=256, help="torch threads (an agent runs one)")] = 1,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """A cold load's phases (read, skeleton, assign, first answer) beside its limit (copy + answer)."""
    from failsoft.bench.load import LoadBenchSettings, run
    from failsoft.zoo.repository import ModelRepository, resolve_repository

    settings = LoadBenchSettings(tuple(variants), repeats=repeats, threads=threads)
    _emit(run(ModelRepository(resolve_repository(root)), settings), out)


@app.command("replication")
def replication(
    config: Annotated[
        Path,
        typer.Argument(
            help="Serving config (YAML) with a stateful graph service, e.g. examples/graph-auto-pilot.yaml"
        ),
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="nspb, stop-and-copy, none (repeatable; default: all three)"),
    ] = None,
    requests: Annotated[int, typer.Option(min=2, max=100_000, help="Failure-free requests measured")] = 150,
    warmup: Annotated[int, typer.Option(min=0, max=10_000, help="Requests sent first, not measured")] = 20,
    after_kill: Annotated[int, typer.Option(min=1, max=10_000, help="Requests sent after the kill")] = 30,
    kill_node: Annotated[
        str | None, typer.Option(help="Stateful node whose primary's server is killed (default: the first)")
    ] = None,
    rounds: Annotated[
        int, typer.Option(min=1, max=20, help="Clusters per policy, the policies alternating")
    ] = 2,
    ship_interval_ms: Annotated[
        float | None,
        typer.Option(min=0, max=60_000, help="Space each node's state transfers (default: the config's)"),
    ] = None,
    root: Annotated[str | None, typer.Option(help="Model repository (default: the config's)")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """HAMS's nspb vs stop-and-copy vs none per graph: overhead, latency, recovery, consistency."""
    from failsoft.bench.replication import POLICIES, ReplicationBenchSettings, run

    settings = ReplicationBenchSettings(
        policies=tuple(policy or POLICIES), requests=requests, warmup=warmup, after_kill=after_kill,
        kill_node=kill_node, rounds=rounds, ship_interval_ms=ship_interval_ms, root=root,
    )  # fmt: skip
    _emit(run(config, settings, progress=_progress), out)


@app.command("serving")
def serving(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/edge.yaml", show_default=False)
    ],
    app_name: Annotated[
        str | None, typer.Option("--app", help="The app to serve (default: the config's first)")
    ] = None,
    concurrency: Annotated[
        list[int] | None,
        typer.Option(
            "--concurrency", "-c", min=1, max=1024, help="Closed-loop clients (repeatable; default 1, 8, 32)"
        ),
    ] = None,
    duration_s: Annotated[float, typer.Option(min=0.2, max=3600, help="Seconds measured per level")] = 10.0,
    warmup_s: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds of load before each level counts")
    ] = 2.0,
    rate_rps: Annotated[
        float | None,
        typer.Option(min=0.1, help="Open-loop rate (default: half failsoft's best closed-loop JSON rate)"),
    ] = None,
    system: Annotated[
        list[str] | None,
        typer.Option(
            "--system",
            "-s",
            help="inprocess, failsoft, failsoft-ray, fastapi, ray-serve, ray-serve-batch (repeatable; "
            "default: all; the Ray Serve ones need the extra failsoft[anchors])",
        ),
    ] = None,
    encoding: Annotated[
        list[str] | None, typer.Option("--encoding", "-e", help="json, binary (repeatable; default: both)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """Steady-state serving side by side: failsoft's gateway (JSON, binary), the model in-process,
    a plain FastAPI app, Ray Serve (one replica, without and with batching); requests/s, p50/p99,
    errors, server CPU per request, ratios, failsoft's phases."""
    from failsoft.bench.serving import ENCODINGS, SYSTEMS, ServingSettings, run

    settings = ServingSettings(
        app=app_name, concurrency=tuple(concurrency or (1, 8, 32)), duration_s=duration_s, warmup_s=warmup_s,
        rate_rps=rate_rps, systems=tuple(system or SYSTEMS), encodings=tuple(encoding or ENCODINGS),
    )  # fmt: skip
    _emit(run(config, settings, progress=_progress), out)


@app.command("overload")
def overload(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/overload.yaml", show_default=False)
    ],
    app_name: Annotated[
        str | None, typer.Option("--app", help="The app to serve (default: the config's first)")
    ] = None,
    base_clients: Annotated[
        int, typer.Option(min=1, max=1024, help="Closed-loop clients of the first phase")
    ] = 8,
    clients: Annotated[int, typer.Option(min=2, max=1024, help="Closed-loop clients of the overload")] = 32,
    base_s: Annotated[
        float, typer.Option(min=0.2, max=3600, help="Seconds measured at --base-clients")
    ] = 20.0,
    duration_s: Annotated[
        float, typer.Option(min=0.2, max=3600, help="Seconds measured at --clients")
    ] = 60.0,
    warmup_s: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds of load before each phase counts")
    ] = 3.0,
    deadline_s: Annotated[float, typer.Option(min=0.01, max=600, help="Every request's deadline")] = 2.0,
    encoding: Annotated[str, typer.Option(help="binary or json")] = "binary",
    backoff: Annotated[
        bool, typer.Option(help="Clients wait out a refusal's Retry-After (default: they ask again at once)")
    ] = False,
    slow_ms: Annotated[
        float, typer.Option(min=0, max=60_000, help="Delay injected into every batch of the server")
    ] = 0.0,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """One server past what it can answer: goodput at --clients against --base-clients, refusals
    (503 + Retry-After, at once), deadline misses, failure events (there must be none)."""
    from failsoft.bench.overload import OverloadSettings, run

    settings = OverloadSettings(
        app=app_name, base_clients=base_clients, clients=clients, base_s=base_s, duration_s=duration_s,
        warmup_s=warmup_s, deadline_s=deadline_s, encoding=encoding, backoff=backoff, slow_ms=slow_ms,
    )  # fmt: skip
    _emit(run(config, settings, progress=_progress), out)


@app.command("partition")
def partition(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/partition.yaml", show_default=False)
    ],
    server: Annotated[
        str | None, typer.Option(help="Server to cut off (default: the one with the most primaries)")
    ] = None,
    partition_s: Annotated[float, typer.Option(min=0.5, max=600, help="Seconds the link stays down")] = 5.0,
    rate: Annotated[float, typer.Option(min=1, max=500, help="Requests per second over all apps")] = 20.0,
    subnet: Annotated[
        str, typer.Option(help="The private /24 for the namespaces (first three octets)")
    ] = "10.77.0",
    fault: Annotated[
        str, typer.Option(help="partition: the link down, then up; kill: the node's processes, then a reboot")
    ] = "partition",
    logs: Annotated[Path | None, typer.Option(help="Keep the processes' and Ray's logs here")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """Partition a server under load and heal it, across network namespaces (root; Linux)."""
    from failsoft.bench.partition import FAULTS, PartitionSettings, run

    _one_of(fault, FAULTS, "--fault")
    settings = PartitionSettings(
        server=server, partition_s=partition_s, rate_rps=rate, subnet=subnet, fault=fault, logs=logs
    )
    _emit(run(config, settings, progress=_progress), out)


@app.command("rollout")
def rollout(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/edge.yaml", show_default=False)
    ],
    period_s: Annotated[
        float, typer.Option(min=0.005, max=10, help="Seconds between an app's requests")
    ] = 0.05,
    warmup_s: Annotated[float, typer.Option(min=0, max=600, help="Seconds of load before the rollout")] = 3.0,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """Roll every app out to a new version under load: failed requests, the largest answer gap per
    app against its usual p99, answers after the switch from the new version."""
    from failsoft.bench.rollout import run

    _emit(run(config, period_s=period_s, warmup_s=warmup_s, progress=_progress), out)


@app.command("autoscale")
def autoscale(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/autoscale.yaml", show_default=False)
    ],
    app_name: Annotated[
        str | None, typer.Option("--app", help="The autoscaled app (default: the config's first)")
    ] = None,
    levels: Annotated[
        list[int] | None,
        typer.Option("--level", "-l", min=1, max=1024, help="Requests in flight per step (default 1 2 4 8)"),
    ] = None,
    step_s: Annotated[float, typer.Option(min=1, max=600, help="Seconds per step")] = 8.0,
    slow_ms: Annotated[
        float, typer.Option(min=0, max=10_000, help="Latency added to every inference (a slower model)")
    ] = 0.0,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """An autoscaled app under a load ramp: replicas over time, p99 against the unloaded p99,
    failed requests, and whether it scaled back in."""
    from failsoft.bench.autoscale import AutoscaleSettings, run

    settings = AutoscaleSettings(
        app=app_name, levels=tuple(levels or (1, 2, 4, 8)), step_s=step_s, slow_ms=slow_ms
    )
    _emit(run(config, settings, progress=_progress), out)


def _progress(message: str) -> None:
    typer.echo(message, err=True)


def _emit(result: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's JSON, and also write it to ``out`` when given."""
    if out is not None:
        _write_json(result, out)
    typer.echo(json.dumps(result, indent=2))


def _write_json(result: dict[str, Any], out: Path) -> None:
    """Write ``result`` to ``out`` whole or not at all (a temporary file renamed over it), so that
    results written after each run of a long benchmark are never left half-written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
