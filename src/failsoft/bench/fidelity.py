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
   heartbeat, load slots, drain period and serving queue, and the runtime's 5 ms health checks. As
   in the runtime, a load ends with its warm-up inferences, reads its weights from the page cache
   or the disk as the run set them (``--page-cache``: only a cold load waits for the disk, beside
   its profiled CPU work), and every server shares this machine's cores
   (:class:`~failsoft.sim.cpu.SharedCPU`: loads at the runtime's lower CPU priorities,
   inference at the agent's own). A simulated first answer is one batch-1 inference of the first
   variant, sent when the route is published and run on those shared cores, plus the serving path's
   overhead on this machine (gateway, Ray call, queue), measured in the same run as each affected
   app's usual latency minus its primary's profiled latency;
3. per app, ``|sim - runtime| / runtime``, and its median over the affected apps.

The runtime runs are kept in the output (``runtime_runs``): ``--replay OUTPUT.json`` compares them
again with the simulator (after a change to it) without starting a cluster.

The mechanisms' copies are twinned too: a HAMS node's pinned backup starts the twin as pinned and
is promoted at detection on both sides (kind ``promoted``), and on a config with an slo service each
runtime run first times Jellyfish's ladder switches, simulated by :mod:`.fidelity_switch`.

Printed: ``{"per_app": {APP: {"runtime_mttr_ms", "sim_mttr_ms", "mttr_error_pct", "mttr_error_ms",
"runtime_first_answer_ms", "sim_first_answer_ms", "kind", "first_variant", "runtime_spread_pct"}},
"median_abs_error_pct": {"mttr", "first_answer"}, "median_mttr_error_pct_by_kind": {KIND: ...},
"median_mttr_error_ms_by_kind": {...}, "abs_error_ms": {...}, "runtime_spread_pct": {"single_run",
"mean_of_runs"}, "switches": {"events", "median_abs_error_pct"} (slo), ...}``. ``runtime_spread_pct``
is the runtime's own run-to-run noise (:func:`run_spread_pct`), the floor the errors are read
against. What the simulator leaves out is listed under ``not_modelled``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.bench import fidelity_switch
from failsoft.bench.failover import (
    BenchSettings,
    bench_config,
    contended_profiles,
    run_once,
    victims,
)
from failsoft.bench.models import ensure_models
from failsoft.domain import WarmBackup
from failsoft.errors import ConfigError
from failsoft.runtime.config import RuntimeConfig, load_config
from failsoft.zoo.machine import usable_cores

if TYPE_CHECKING:
    from failsoft.sim import Deployment, SimConfig

Progress = Callable[[str], None]
CHECK_INTERVAL_S = 0.005  # the runtime controller's health-check tick
HOST_MODELS = ("probe", "steady", "pin", "recovery")
# The busy cores before the kill. Replayed with the control cost a crash meets (40-60 ms for a small
# load, what the urgent probe under a heavy load measures), the quiet set of the afternoon of
# 2026-11-27 (docs/results/fidelity-set-round4.json) twinned with ``steady`` at 13/38/48/11% on
# bench/small/pair/one against ``probe``'s 42/38/47/7%: the same but on bench.yaml, where the spin
# (which shares its agent's interpreter lock with the agent's answers) read 0.07-0.77 of a core for
# one priority on one host. Earlier sets that favoured ``probe`` had the old control probe (pins at
# the background priority, 300-400 ms for a 2 ms load on a busy host) inflating every small load.
DEFAULT_HOST_MODEL = "steady"
# How the twin spends the control path's cost (the control probe's pins against their twins): ``wait``
# holds each load's slot that long, taking no core; ``work`` runs it as CPU work at nice 0 before the
# load's own, fitted so that the probes' twins take as long as their pins did, so it takes longer
# when more runs beside it (several loads at once in a recovery, where the probe had one); ``ahead``
# is that work run before the loads and the background (sim/cpu.py): the path is a chain of short
# wake-ups (the controller's call, Ray's RPC threads, the agent's pick-up, the route's publication),
# each of which the kernel runs ahead of long-running loads, so it waits only for other control work.
# ``work`` was chosen on the pooled runs of round 12 (docs/results/fidelity-control-pooled-round12.json);
# ``ahead`` on every quiet run of rounds 8-13, pooled per config and replayed with all three (within
# 25% on 10 of 12 configs as ``work`` is, with a lower median and worst case: site 41.8% against
# 68.1), then judged on two configs held out until then: examples/fidelity-beside.yaml 35.9%
# (``work`` 58.5), examples/fidelity-fan.yaml 27.7% (31.5); with round 14 pooled, within 25% on 11
# of 14 configs, ``work`` on 10 (docs/results/fidelity-control-pooled-round14.json, docs/simulator.md).
CONTROL_MODELS = ("wait", "work", "ahead")
DEFAULT_CONTROL_MODEL = "ahead"
CONTROL_FIELDS = {"wait": "control_ms", "work": "control_work_ms", "ahead": "control_ahead_ms"}
# The control path's cost as a constant of the host (--control-from): each run's probe is four pins,
# and the same config's runs fitted 19-63 ms of it (examples/fidelity.yaml, three sets of one
# afternoon), which moved the twin's small loads as much; the median over many runs' probes is the
# cost the path has on this host. Taken from the runs of the two configs the twin is fitted on only,
# so that every other config stays held out.
CALIBRATION_CONFIGS = ("bench", "fidelity")
NOT_MODELLED = [
    "how the CPU taken by everything but loads and first answers (the gateway, the controller, Ray, "
    "the clients, the steady load, other sessions) changes during the recovery: it is modelled as "
    "measured before the kill (--host), constant",
    "which core each job runs on: the scheduler's per-core queues let one of two concurrent loads "
    "finish well before the other (runs differ in which), where a fluid share ends both together",
    "the interpreter lock inside one agent process: a load and an inference on the same server take "
    "turns at Python's lock whatever their CPU priority",
    "the controller's own processing time between detection and a published route (about a millisecond)",
    "the control path's split between CPU and waiting: with --control ahead it is all CPU work, "
    "fitted on pins one at a time, so many recoveries at once stretch it too much (on an idle "
    "cluster a small pin took 5-12 ms of wall time and about 12 ms of the cluster's CPU with its "
    "release, where the fitted work is about 22 ms): the twin's small loads took up to 1.8 times the "
    "runtime's time with seven or more recoveries at once (examples/fidelity-fan.yaml, "
    "fidelity-beside.yaml)",
    "where the control path queues: it runs in parallel across agents' processes and queues inside "
    "one, where the twin shares it over the host; with every recovery on one agent the twin's small "
    "loads took down to a third of the runtime's time (examples/fidelity-converge.yaml); queuing "
    "the fitted work per server instead (tried: docs/results.md, round 16) moved converge's heavy "
    "loads toward the runtime but left the twin too fast where one survivor takes four loads "
    "(examples/fidelity-halves.yaml: 37.4% against ahead's 39.2)",
    "the runtime's detection of a killed agent by its sidecar's death notice, a few milliseconds "
    "after each kill: two servers killed one call apart are noticed and planned apart there, where "
    "the twin detects both from their heartbeats at one check and plans them together, so their "
    "loads take the survivors' slots in another order (examples/fidelity-converge.yaml: the first "
    "server's heavy load took a slot at once, the second's small loads queued behind it)",
    "Ray call and long-poll latencies (the first answer's overhead is measured, not simulated)",
    "the disk's own contention: a cold load's wait for the disk is its profiled wait, however many "
    "loads read at once (the page-cache state itself is set and told: --page-cache)",
    "garbage collection and thermal noise of the real machine",
]


def run(
    config_path: str | Path,
    kill: Sequence[str] = (),
    repeats: int = 3,
    sim_seeds: int = 20,
    progress: Progress | None = None,
    runs: list[dict[str, Any]] | None = None,
    host: str = DEFAULT_HOST_MODEL,
    page_cache: str = "warm",
    control: str = DEFAULT_CONTROL_MODEL,
    host_control_ms: float | None = None,
) -> dict[str, Any]:
    """Run the crash ``repeats`` times (or take ``runs`` of an earlier output) and simulate it,
    telling the twin of the host's other work as ``host`` says (:func:`host_twin`) and spending the
    control path's cost as ``control`` says (:func:`control_cost`): each run's own probe's, or
    ``host_control_ms`` for every run (the host's constant: :func:`calibrate_control`). ``page_cache``
    sets the weights' state at the kill (``warm`` or ``cold``); the twin is told each run's."""
    if control not in CONTROL_MODELS:
        raise ConfigError(f"control model must be one of {', '.join(CONTROL_MODELS)}; got {control!r}")
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    base = load_config(config_path)
    ensure_models(base, say)
    crowded = contended_profiles(base)
    if crowded:
        say(
            f"[fidelity] warning: {len(crowded)} profiles were measured on a busy host, their times "
            f"inflated ({', '.join(crowded[:4])}{', ...' if len(crowded) > 4 else ''}); measure them "
            "again on a quiet machine: failsoft zoo profile -f "
            + ",".join(sorted({c.split("/")[0] for c in crowded}))
        )
    if runs is not None:
        failed = sorted({s for r in runs for s in r["detection_ms"]}) or list(kill)
        say(f"[fidelity] replaying {len(runs)} runtime runs (killed {', '.join(failed)})")
        return _simulated(
            str(config_path), base, failed, runs, sim_seeds, say, host, control, host_control_ms
        )
    from failsoft.runtime.controller import orchestration_settings

    settings = BenchSettings(
        policies=(base.policy,), kill=tuple(kill), repeats=repeats, page_cache=page_cache
    )
    failed = victims(base, settings)
    runs = []
    for repeat in range(repeats):
        say(f"[fidelity] runtime run {repeat + 1}/{repeats}: killing {', '.join(failed)} ...")
        cfg = bench_config(base, base.policy)
        try:
            run = run_once(
                cfg, failed, settings, say,
                before_kill=partial(_before_kill, cfg, failed), under_load=partial(_under_load, cfg, failed),
            )  # fmt: skip
            settings_ = orchestration_settings(cfg)  # the twin takes the run's heavy-load limit
            run["heavy_load_slots"] = settings_.heavy_load_slots
            run["heavy_loads_per_host"] = settings_.heavy_loads_per_host
            runs.append(run)
        finally:
            shutil.rmtree(cfg.state_dir, ignore_errors=True)
    return _simulated(str(config_path), base, failed, runs, sim_seeds, say, host, control, host_control_ms)


def _before_kill(cfg: RuntimeConfig, failed: Sequence[str], session: Any, client: Any) -> dict[str, Any]:
    """On the stable cluster, before the steady load: Jellyfish's ladder switches on an slo config."""
    return fidelity_switch.measure(cfg, failed, session, client) if fidelity_switch.slo_members(cfg) else {}


def _under_load(cfg: RuntimeConfig, failed: Sequence[str], session: Any, client: Any) -> dict[str, Any]:
    """Under the steady load, before the host is measured: the control probe (the crash happens
    under that load too: the gateway, the clients and the answers share the cores with it)."""
    return {"control_probe": fidelity_switch.probe(cfg, failed, session, client)}


def _simulated(
    config_path: str,
    base: RuntimeConfig,
    failed: Sequence[str],
    runs: list[dict[str, Any]],
    sim_seeds: int,
    say: Progress,
    host: str = DEFAULT_HOST_MODEL,
    control: str = DEFAULT_CONTROL_MODEL,
    host_control_ms: float | None = None,
) -> dict[str, Any]:
    say(f"[fidelity] simulating the same crash ({sim_seeds} seeds per runtime run) ...")
    sims = [simulate_run(base, r, failed, sim_seeds, host, control, host_control_ms) for r in runs]
    crowded = contended_profiles(base)
    extra: dict[str, Any] = {
        "host_model": host,
        "control_model": control,
        # each run's own probe, or one constant for the host (calibrate_control)
        "control_cost_ms": "each run's probe" if host_control_ms is None else round(host_control_ms, 2),
        "contended_profiles": crowded,
        "runtime_runs": runs,
    }
    switched = [simulate_switches(base, r, host, control) for r in runs]
    if any(switched):
        extra["switches"] = fidelity_switch.summarize(switched)
    return compare(config_path, failed, base.policy, runs, sims) | extra


def replayed(*paths: str | Path) -> list[dict[str, Any]]:
    """The runtime runs kept in earlier outputs of this benchmark, pooled (they must be runs of one
    config and one killed set: more runs of the same crash)."""
    runs: list[dict[str, Any]] = []
    crash = None
    for path in paths:
        try:
            out = json.loads(Path(path).read_text())
            found, this = out["runtime_runs"], (out["config"], sorted(out["failed"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{str(path)!r} is not an output of 'failsoft bench fidelity': {exc}") from exc
        if not isinstance(found, list) or not found:
            raise ConfigError(f"{str(path)!r} holds no runtime runs to replay")
        if crash is not None and this != crash:
            raise ConfigError(
                f"{str(path)!r} is a run of {this[0]} killing {', '.join(this[1])}, not of {crash[0]} "
                f"killing {', '.join(crash[1])}: only runs of one crash are pooled"
            )
        crash = this
        runs += found
    return runs


def simulate_run(
    config: RuntimeConfig,
    observed: dict[str, Any],
    failed: Sequence[str],
    seeds: int,
    host: str = DEFAULT_HOST_MODEL,
    control: str = DEFAULT_CONTROL_MODEL,
    host_control_ms: float | None = None,
) -> dict:
    """The simulated counterpart of one runtime run: per app, mean simulated MTTR over ``seeds``;
    ``host`` names what the twin is told of the host's other work (:func:`host_twin`), ``control``
    how it spends the control path's cost (:func:`control_cost`; ``host_control_ms``: that cost,
    the host's constant, instead of the run's own probe's)."""
    from failsoft.sim import simulate_failure

    deployment = as_deployed(config, observed["warm"])
    scenario = deployment.scenario
    fitted = pinned_share(config, observed) if host == "pin" else None
    if fitted is not None:  # the share a heavy load got under the steady load, and its control cost
        sim_config = twin_config(config, _with_share(observed, fitted[0]), "probe")
        cost = {"control_ms": fitted[1]}
    else:
        sim_config = twin_config(config, observed, host)
        if host_control_ms is not None and run_probes(observed).get("events"):
            cost = {CONTROL_FIELDS[control]: host_control_ms}  # the host's: this run's probe not fitted
        else:  # ... runs recorded without any probe keep none
            cost = control_cost(config, observed, host, control=control)
    probes = ((observed.get("before_kill") or {}).get("control_probe") or {}).get("events") or []
    sim_config = dataclasses.replace(
        with_control(sim_config, cost), plan_wait_ms=fidelity_switch.hop_ms(probes)
    )
    mttr: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}
    for seed in range(seeds):
        event = simulate_failure(deployment, failed, sim_config, seed=seed)
        for app, record in event.apps.items():
            if record.recovered:
                mttr.setdefault(app, []).append(record.mttr_ms)
            if record.answered_at is not None:
                first.setdefault(app, []).append(record.first_answer_ms)
    return {
        "mttr_ms": {app: statistics.fmean(v) for app, v in mttr.items()},
        "first_answer_ms": {app: statistics.fmean(v) for app, v in first.items()},
        "primary_latency_ms": {a.name: scenario.primary_variant(a).latency_ms for a in scenario.apps},
    }


def twin_config(config: RuntimeConfig, observed: dict[str, Any], host: str = DEFAULT_HOST_MODEL) -> SimConfig:
    """The simulator's settings for a twin of ``config`` as one runtime run found the host."""
    from failsoft.sim import PageCache, RequestMode, SimConfig

    cores = float(usable_cores())
    return SimConfig(
        heartbeat_interval_s=config.heartbeat.interval_s,
        missed_to_fail=config.heartbeat.missed_to_fail,
        check_interval_s=CHECK_INTERVAL_S,
        notify_ms=0.0,  # FailLite's MTTR ends when the route is published, as the runtime's does
        load_slots=config.agents.max_parallel_loads,
        # as the run had it (runs recorded before heavy slots existed ran heavy loads in every slot)
        heavy_load_slots=observed.get("heavy_load_slots"),
        # ... on the whole host or per server (runs recorded before the host-wide limit: per server)
        heavy_loads_per_host=bool(observed.get("heavy_loads_per_host", False)),
        drain_ms=config.agents.drain_ms,
        requests=RequestMode.OFF,
        max_batch=config.agents.queue.max_batch,
        warm_up=True,
        page_cache=PageCache(run_page_cache(observed)),
        host_cores=cores,  # the embedded cluster's agents share them
        first_answer=True,
        **host_twin(observed, cores, host),
    )


def simulate_switches(
    config: RuntimeConfig,
    observed: dict[str, Any],
    host: str = DEFAULT_HOST_MODEL,
    control: str = DEFAULT_CONTROL_MODEL,
) -> list[dict]:
    """The simulated half of one runtime run's ladder switches (:mod:`.fidelity_switch`): each
    switch's request on the deployment as it was then, with the settings of the crash's twin and
    the load share probed just before the switches."""
    from failsoft.sim import simulate_pin

    switches = observed.get("before_kill") or {}
    if not switches.get("events"):
        return []
    deployment = as_deployed(config, switches["warm"])
    sim_config = twin_config(
        config, {**observed, "host_cpu": {**(observed.get("host_cpu") or {}), **switches["host_cpu"]}}, host
    )
    # the control cost, measured apart from the switches (never from themselves): the calm probe made
    # just before them, else (runs recorded before it) the crash's probe
    calm = switches.get("calm_probe") if (switches.get("calm_probe") or {}).get("events") else None
    if calm is not None or switches.get("control_probe"):
        sim_config = with_control(sim_config, control_cost(config, observed, host, calm, control))
    return [
        fidelity_switch.compared(e, simulate_pin(deployment, fidelity_switch.request(e), sim_config))
        for e in switches["events"]
    ]


def control_cost(
    config: RuntimeConfig,
    observed: dict[str, Any],
    host: str = DEFAULT_HOST_MODEL,
    probes: dict[str, Any] | None = None,
    control: str = DEFAULT_CONTROL_MODEL,
) -> dict[str, float]:
    """The control path's cost the run's probe measured (:func:`fidelity_switch.probe`), or
    ``probes`` (another probe of the run: the switches' calm one), as the ``SimConfig`` field that
    ``control`` names: its pins, simulated with the crash twin's settings, against the runtime; a
    ``wait`` (``control_ms``) is the median gap of their twins without it, ``work``
    (``control_work_ms``) the work at nice 0 that closes it, ``ahead`` (``control_ahead_ms``) the work
    run ahead of the loads that closes it. A run recorded without the probe falls
    back to its ladder switches (the same path; slo configs), else to none (not modelled)."""
    if probes is None:
        probes = run_probes(observed)
    if not probes.get("events"):
        return {}
    deployment = as_deployed(config, probes["warm"])
    sim_config = twin_config(
        config, {**observed, "host_cpu": {**(observed.get("host_cpu") or {}), **probes["host_cpu"]}}, host
    )
    events = probes["events"]
    if control == "wait":
        return {"control_ms": fidelity_switch.control_ms(simulated_probes(deployment, events, sim_config))}
    ahead = control == "ahead"
    work = fidelity_switch.control_work_ms(
        lambda ms: simulated_probes(
            deployment, events, dataclasses.replace(sim_config, control_work_ms=ms, control_ahead=ahead)
        )
    )
    return {"control_ahead_ms" if ahead else "control_work_ms": work}


def run_probes(observed: dict[str, Any]) -> dict[str, Any]:
    """The pins a run's control cost is fitted on: its control probe, else its ladder switches (the
    same path; runs recorded before the probe), else none (``{}``)."""
    before = observed.get("before_kill") or {}
    if before.get("control_probe"):
        return before["control_probe"]
    return {"events": before["events"], **before} if before.get("events") else {}


def calibrate_control(
    outputs: Sequence[dict[str, Any]],
    config_of: Callable[[str], RuntimeConfig] = load_config,
    host: str = DEFAULT_HOST_MODEL,
    control: str = DEFAULT_CONTROL_MODEL,
    configs: Sequence[str] = CALIBRATION_CONFIGS,
) -> dict[str, Any]:
    """The control path's cost as a constant of the host: the median over every probe-carrying run
    of ``configs`` (file stems; :data:`CALIBRATION_CONFIGS`) in ``outputs`` (of ``bench fidelity``
    or ``bench fidelity-set``, less a set's configs flagged busy; ``config_of`` loads a recorded
    config path) of the cost its probe fits (:func:`control_cost`). Returns ``{"ms", "runs",
    "per_run_ms", "configs"}``; a ConfigError when no such run is there."""
    found: list[tuple[str, dict[str, Any]]] = []
    for out in outputs:
        for result in _fidelity_results(out):
            if Path(str(result.get("config", ""))).stem in configs:
                found += [(str(result["config"]), r) for r in result.get("runtime_runs") or []]
    fitted: list[float] = []
    used: set[str] = set()
    loaded: dict[str, RuntimeConfig] = {}
    for path, observed in found:
        config = loaded.get(path) or loaded.setdefault(path, config_of(path))
        cost = control_cost(config, observed, host, control=control)
        if cost:
            fitted.append(cost[CONTROL_FIELDS[control]])
            used.add(path)
    if not fitted:
        raise ConfigError(
            "no run with a control probe of the calibration configs "
            f"({', '.join(c + '.yaml' for c in configs)}) in the outputs given: run "
            "'failsoft bench fidelity-set --only bench.yaml --only fidelity.yaml --out FILE' first"
        )
    return {
        "ms": round(statistics.median(fitted), 2),
        "runs": len(fitted),
        "per_run_ms": [round(v, 2) for v in fitted],
        "configs": sorted(used),
    }


def _fidelity_results(out: Any) -> list[dict[str, Any]]:
    """The ``bench fidelity`` results inside an output of it or of ``bench fidelity-set``, less the
    configs a set flagged as run on a busy host (their probes met other work, not the path's cost)."""
    if not isinstance(out, dict):
        raise ConfigError("not an output of 'failsoft bench fidelity' or 'bench fidelity-set'")
    if isinstance(out.get("configs"), dict):
        return [
            c["detail"]
            for c in out["configs"].values()
            if isinstance(c, dict) and c.get("detail") and c.get("quiet", True)
        ]
    if "runtime_runs" in out:
        return [out]
    raise ConfigError("not an output of 'failsoft bench fidelity' or 'bench fidelity-set' (no runtime runs)")


def with_control(sim_config: SimConfig, cost: dict[str, float]) -> SimConfig:
    """``sim_config`` with the control cost :func:`control_cost` gave (a wait, work, or work ahead of
    the loads; none: 0)."""
    ahead = "control_ahead_ms" in cost
    return dataclasses.replace(
        sim_config,
        control_ms=cost.get("control_ms", 0.0),
        control_work_ms=cost["control_ahead_ms"] if ahead else cost.get("control_work_ms", 0.0),
        control_ahead=ahead,
    )


def simulated_probes(deployment: Any, events: Sequence[dict[str, Any]], sim_config: SimConfig) -> list[dict]:
    """The probe's pins, each beside its twin's milliseconds: all on one simulated cluster at their
    recorded offsets (the small ones while the heavy one loads), or, for runs recorded before the
    offsets, each on its own as it was then run."""
    from failsoft.sim import simulate_pin, simulate_pins

    if any("offset_ms" in e for e in events):
        took = simulate_pins(deployment, fidelity_switch.pins_of(events), sim_config)
        return [fidelity_switch.compared(e, ms) for e, ms in zip(events, took, strict=True)]
    return [
        fidelity_switch.compared(e, simulate_pin(deployment, fidelity_switch.request(e), sim_config))
        for e in events
    ]


def pinned_share(config: RuntimeConfig, observed: dict[str, Any]) -> tuple[float, float] | None:
    """The ``pin`` host model: the share of a core (``host_load_share``) with which the twin's heavy
    probe (:func:`fidelity_switch.probe`: the config's lightest heavy variant pinned under the
    steady load) takes as long as the runtime's did, and the control cost its small probes give at
    that share; None when the run has no heavy probe (or its twin never ends)."""
    probes = (observed.get("before_kill") or {}).get("control_probe") or {}
    heavy = [e for e in probes.get("events", ()) if e.get("heavy") and e.get("runtime_ms")]
    if not heavy:
        return None
    target = float(heavy[0]["runtime_ms"])
    deployment = as_deployed(config, probes["warm"])

    def twin(share: float) -> tuple[float, float | None]:
        base = twin_config(config, _with_share(observed, share), "probe")
        control = fidelity_switch.control_ms(simulated_probes(deployment, probes["events"], base))
        again = simulated_probes(deployment, probes["events"], dataclasses.replace(base, control_ms=control))
        return control, next(e["sim_ms"] for e in again if e.get("heavy"))

    return fit_share(twin, target)


def fit_share(
    twin: Callable[[float], tuple[float, float | None]], target_ms: float
) -> tuple[float, float] | None:
    """The share of a core (to 1/16000) at which ``twin(share)`` (control cost, milliseconds taken
    or None) takes ``target_ms``, and the control cost there: the twin takes longer as the share
    falls, so bisect; 1.0 where even a whole core is slower than measured, None where it never ends."""
    control, took = twin(1.0)
    if took is None:
        return None
    if took >= target_ms:  # as fast as a whole core allows, or faster
        return 1.0, control
    low, high = PIN_MIN_SHARE, 1.0
    for _ in range(PIN_STEPS):
        mid = (low + high) / 2
        took = twin(mid)[1]
        low, high = (mid, high) if took is None or took > target_ms else (low, mid)
    return high, twin(high)[0]


PIN_MIN_SHARE, PIN_STEPS = 0.01, 14  # the fitted share's range and bisection steps (1/16000 of a core)


def _with_share(observed: dict[str, Any], share: float) -> dict[str, Any]:
    """``observed`` with one measured load share (the ``probe`` model then gives it to the twin)."""
    return {**observed, "host_cpu": {"load_cpu_share": {"fitted": share}}}


def run_page_cache(observed: dict[str, Any]) -> str:
    """The weights' page-cache state a runtime run recorded. Runs that did not set it (older
    outputs, ``bench failover``'s "as found") are read as ``warm``: an embedded cluster's zoo was
    read by its profiler (whose last reads leave every file cached) and by the deployment."""
    return observed.get("page_cache") or "warm"


def host_twin(observed: dict[str, Any], cores: float, model: str = DEFAULT_HOST_MODEL) -> dict[str, Any]:
    """What the simulated host runs beside the loads and first answers (``SimConfig`` fields):

    * ``steady`` (the default, :data:`DEFAULT_HOST_MODEL`): the busy cores of the cluster's own
      scheduling group and of each other group over the last seconds of steady load before the
      kill, as always-runnable demand, less what the recovery will not meet: the killed servers'
      agent processes (their serving ends with them) and the agents' load-share probes, which spin
      in that window (runs recorded before these were measured keep them);
    * ``probe``: the share of a core a thread at the
      loads' priority got before the kill (the
      agents' ``load_cpu_share``, their median), as equivalent competitors. The probe spins in
      Python and waits for its agent's interpreter lock, which a load's torch kernels release: it
      under-reads what a load gets where the agent serves;
    * ``pin``: the share of a core with which the twin's heavy probe (a real heavy load, pinned under
      the steady load before the kill) takes as long as the runtime's did (:func:`pinned_share`,
      applied by :func:`simulate_run`); here, and for runs without that probe, ``steady``;
    * ``recovery``: the busy cores of the cluster's own scheduling group from the kill until every
      affected app answered, less the CPU the agents' loads took meanwhile (the simulation runs
      them as work of its own; the agents count it), and each
      other group's: the gateway, controller, Ray and clients as they ran *during* the recovery
      (when the failed server's traffic had stopped), other sessions' tenants beside. Measured in
      the run it twins: a check of the model, not a prediction.

    Runs recorded before a measurement existed fall back (``recovery`` or ``probe`` -> ``steady``
    -> the unsplit busy cores -> nothing)."""
    if model not in HOST_MODELS:
        raise ConfigError(f"host model must be one of {', '.join(HOST_MODELS)}; got {model!r}")
    steady = observed.get("host_cpu") or {}
    if model == "probe" and steady.get("load_cpu_share"):
        shares = [min(max(float(v), 0.001), 1.0) for v in steady["load_cpu_share"].values()]
        return {"host_load_share": statistics.median(shares)}
    split, loads_cores = steady, 0.0
    if model == "recovery" and steady.get("recovery"):
        split = steady["recovery"]
        loads_cores = split.get("loads_cores")
        if loads_cores is None:  # before the agents counted every load: the first loads only
            loads_ms = sum(a.get("load_cpu_ms") or 0.0 for a in observed["apps"].values())
            loads_cores = loads_ms / 1000.0 / max(float(split["seconds"]), 1e-3)
    if not split:
        return {"host_busy_cores": min(float(observed.get("host_busy_cores", 0.0)), cores)}
    gone = 0.0  # steady: what of the window the recovery does not meet (runs that measured it)
    if split is steady:
        gone = float(steady.get("failed_agents_cores") or 0.0) + float(steady.get("probe_cores") or 0.0)
    own = min(max(float(split["own_cores"]) - loads_cores - gone, 0.0), cores)
    others = tuple(float(c) for c in split["other_groups"].values())
    room = cores - own
    if sum(others) > room:  # counters read a moment apart: never more than the host has
        others = tuple(c * room / sum(others) for c in others)
    return {"host_busy_cores": own, "host_other_groups": others}


def as_deployed(config: RuntimeConfig, warm: Sequence[dict[str, Any]]) -> Deployment:
    """The simulator's deployment of ``config`` with the copies the runtime had loaded (at the kill,
    or at a probe): warm backups, and the copies a mechanism pinned (a HAMS node's backup, a
    Jellyfish rung), which the core promotes at detection in the simulator as in the runtime (route
    kind ``promoted``)."""
    from failsoft.policies.registry import get_failover_policy
    from failsoft.runtime.session import prepare
    from failsoft.sim import Deployment

    backups = tuple(WarmBackup(w["app"], w["variant"], w["server"], bool(w.get("pinned"))) for w in warm)
    scenario = prepare(config).deployment.replace(warm=backups)
    return Deployment(config.policy, get_failover_policy(config.policy), scenario, None)


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
        sim_first = [s["first_answer_ms"][app] + overhead for s in sims if app in s["first_answer_ms"]]
        per_app[app] = {
            "kind": _mode([a["kind"] for a in rt]),
            "first_variant": _mode([a["first_variant"] for a in rt]),
            "runtime_mttr_ms": _mean([a["mttr_ms"] for a in rt]),
            "runtime_load_ms": _mean([a.get("load_ms") for a in rt]),
            "runtime_load_cpu_ms": _mean([a.get("load_cpu_ms") for a in rt]),
            "runtime_load_phases": mean_phases([a.get("load_phases") for a in rt]),
            "sim_mttr_ms": _mean(sim_mttr),
            "runtime_first_answer_ms": _mean([a["first_answer_ms"] for a in rt]),
            "sim_first_answer_ms": _mean(sim_first),
        }
        per_app[app]["mttr_error_pct"] = _error_pct(per_app[app], "mttr")
        per_app[app]["mttr_error_ms"] = _error_ms(per_app[app], "mttr")  # a switch's runtime is ~0
        per_app[app]["runtime_spread_pct"] = run_spread_pct([a["mttr_ms"] for a in rt])
    kinds = sorted({a["kind"] for a in per_app.values() if a["kind"] is not None})
    return {
        "config": config,
        "failed": list(failed),
        "policy": policy,
        "runs": len(runs),
        "per_app": per_app,
        "median_abs_error_pct": {k: _median_error(per_app, k) for k in ("mttr", "first_answer")},
        "abs_error_ms": {k: _abs_errors(per_app, k) for k in ("mttr", "first_answer")},
        # per recovery kind: warm switch, progressive or cold load, ``promoted`` (a pinned copy: HAMS)
        "median_mttr_error_pct_by_kind": {k: _median_error(_of_kind(per_app, k), "mttr") for k in kinds},
        "median_mttr_error_ms_by_kind": {k: _median_ms(_of_kind(per_app, k)) for k in kinds},
        # the runtime's own noise, beside which the errors above are read (see run_spread_pct)
        "runtime_spread_pct": {
            k: median_of_present([(a["runtime_spread_pct"] or {}).get(k) for a in per_app.values()])
            for k in ("single_run", "mean_of_runs")
        },
        "serving_overhead_ms": round(overhead, 2),
        "detection_ms": [round(v, 1) for r in runs for v in r["detection_ms"].values()],
        "failed_requests": sum(r["requests"]["failed"] for r in runs),
        "not_modelled": NOT_MODELLED,
    }


def run_spread_pct(mttr_ms: Sequence[float]) -> dict[str, float] | None:
    """How far one app's runtime runs are from their own mean, in percent of it: ``single_run``,
    the median run's distance from the mean; ``mean_of_runs``, the mean's standard error (the
    error a twin that knew the true mean would show on these runs, about). Without two runs, or for
    a switch (a mean near 0), None. The host's noise floor for a fidelity figure: a median error
    near ``mean_of_runs`` is as good as the runs can tell."""
    if len(mttr_ms) < 2:
        return None
    mean = statistics.fmean(mttr_ms)
    if mean < 1.0:  # a warm switch: the runtime's MTTR is ~0 ms, a percentage means nothing
        return None
    return {
        "single_run": round(statistics.median(abs(v - mean) for v in mttr_ms) / mean * 100.0, 1),
        "mean_of_runs": round(statistics.stdev(mttr_ms) / math.sqrt(len(mttr_ms)) / mean * 100.0, 1),
    }


def median_of_present(values: Sequence[float | None]) -> float | None:
    """The median of the values that are there, to 0.1; None when none is."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def mean_phases(timelines: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The mean over runs of one app's MTTR segments and agent phases (``runtime.load_phases``
    timelines; runs recorded before the phases existed are left out)."""
    present = [t for t in timelines if t]
    if not present:
        return None
    out: dict[str, Any] = {k: _mean([t.get(k) for t in present]) for k in present[0] if k.endswith("_ms")}
    phases = dict.fromkeys(p for t in present for p in t.get("agent", {}))
    out["agent"] = {
        p: {
            k: _mean([(t.get("agent", {}).get(p) or {}).get(k) for t in present])
            for k in ("wall_ms", "cpu_ms", "runnable_ms", "blocked_ms")
        }
        for p in phases
    }
    return out


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


def _error_pct(app: dict[str, Any], key: str) -> float | None:
    rt, sim = app[f"runtime_{key}_ms"], app[f"sim_{key}_ms"]
    return round(abs(sim - rt) / rt * 100.0, 1) if rt is not None and sim is not None and rt > 0 else None


def _error_ms(app: dict[str, Any], key: str) -> float | None:
    rt, sim = app[f"runtime_{key}_ms"], app[f"sim_{key}_ms"]
    return round(abs(sim - rt), 2) if rt is not None and sim is not None else None


def _median_ms(per_app: dict[str, dict[str, Any]]) -> float | None:
    errors = [a["mttr_error_ms"] for a in per_app.values() if a["mttr_error_ms"] is not None]
    return round(statistics.median(errors), 1) if errors else None


def _of_kind(per_app: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {name: a for name, a in per_app.items() if a["kind"] == kind}


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
