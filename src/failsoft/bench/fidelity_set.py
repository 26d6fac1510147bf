"""``failsoft bench fidelity-set``: ``bench fidelity`` on every config of the fidelity set, one JSON.

The simulator's claim to twin the runtime holds only if it holds on configs it was not fitted on,
and a fidelity figure means something only on a quiet machine: on a host whose cores other work
takes, the runtime's loads stretch by what that work happens to do, which no twin can know. So each
config's figure is recorded beside the contention it ran under:

* ``loadavg``: the host's 1-minute load average per usable core just before the config's runs
  (after waiting up to ``settle_s`` for the previous config's cluster to fade from it) and after;
* ``other_busy_cores``: the cores every scheduling group but the cluster's own took during the
  steady load before each kill (measured by ``bench failover``'s probes), the median over runs;
* ``contended_profiles``: the profiles the zoo flagged as measured on a busy host.

A config is ``quiet`` when the load before it stayed at or under :data:`QUIET_LOAD_PER_CORE`, the
other groups under :data:`QUIET_OTHER_CORES` and no profile is contended; only then is its median
MTTR error reported as ``figure`` (otherwise ``figure`` is null and ``flagged`` says why: a busy run
is kept, for its per-app detail, but never reported as a fidelity figure).

Printed: ``{"configs": {NAME: {"config", "failed", "median_mttr_error_pct", "median_first_answer_error_pct",
"median_mttr_error_pct_by_kind", "runtime_spread_pct", "figure", "quiet", "flagged", "loadavg",
"other_busy_cores", "contended_profiles", "detail"}}, "median_mttr_error_pct": {"quiet", "all"},
"host": {...}, "host_control": {...}}``.

``host_control``: the figures again with the control path's cost taken as one constant of the host
(``bench fidelity --control-from``), calibrated on the set's own quiet ``bench.yaml`` and
``fidelity.yaml`` runs: ``{"calibration": {"ms", "runs", "per_run_ms", "configs"},
"median_mttr_error_pct": {"quiet", "all"}, "configs": {NAME: {"median_mttr_error_pct",
"median_mttr_error_pct_by_kind", "figure"}}}``, or ``{"calibration": null, "reason"}`` when the set
ran neither quiet. With ``--control-from`` the constant given is the only model (no such block).

``replay`` (``--replay SET.json``) simulates again the runtime runs an earlier output recorded, with
the contention they ran under, and starts no cluster: a change to the simulator's host model is
judged offline against the runs of a quiet machine.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from failsoft.bench.fidelity import median_of_present
from failsoft.errors import ConfigError

QUIET_LOAD_PER_CORE = 0.3  # 1-minute load average per usable core before a config's runs
QUIET_OTHER_CORES = 0.2  # cores the host's other scheduling groups took beside the cluster

# (config, the servers killed): the two configs the host model was fitted on, the two written before
# any change to it (examples/fidelity-dense.yaml, examples/fidelity-small.yaml), one written before
# the next change (examples/fidelity-pair.yaml: two servers killed at once), one written before the
# steady host model and the host-wide heavy-load limit (examples/fidelity-one.yaml: one survivor
# takes every recovery, heavy and small loads on one server's slots), one written before the session
# of 2026-11-27's change (examples/fidelity-spread.yaml: one server's loads spread over three
# survivors of one slot each) and one before its last change (examples/fidelity-site.yaml: a whole
# site of two servers dark), examples/fidelity-busy.yaml (busy survivors), two written before the
# twin's control path (fidelity-queue.yaml; fidelity-mixed.yaml, held out until it was chosen), one
# written before its short-job model (fidelity-beside.yaml, held out the same way), one before the
# change after that (fidelity-fan.yaml: eight apps fan out over five survivors), one before the
# control path's split into work and waiting (fidelity-converge.yaml: two servers' apps converge on
# one survivor, held out the same way), one before the per-server control lane was judged
# (fidelity-halves.yaml: one server's seven apps split over two survivors), one before the recovery
# storm model (fidelity-tiers.yaml: two servers of two sites die at once, survivors of three tiers,
# three load slots, 25 ms x 3 heartbeats), one before the control path's host constant
# (fidelity-serial.yaml: one server's six apps on survivors of one load slot each), one after the
# runtime's joined plans and before any run of it (fidelity-wide.yaml: one server's eight apps over
# three survivors of two slots each), and the mechanism twins: a HAMS backup promotion (the graph's
# stateful node c2 on s1) and the slo service's workers.
FIDELITY_SET: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("examples/bench.yaml", ("a1",)),
    ("examples/fidelity.yaml", ("b1",)),
    ("examples/fidelity-dense.yaml", ("d1",)),
    ("examples/fidelity-small.yaml", ("s1",)),
    ("examples/fidelity-pair.yaml", ("p1", "p3")),
    ("examples/fidelity-one.yaml", ("o1",)),
    ("examples/fidelity-spread.yaml", ("f1",)),
    ("examples/fidelity-site.yaml", ("x1", "x2")),
    ("examples/fidelity-busy.yaml", ("g1",)),
    ("examples/fidelity-queue.yaml", ("q1",)),
    ("examples/fidelity-mixed.yaml", ("h1", "h3")),
    ("examples/fidelity-beside.yaml", ("w1",)),
    ("examples/fidelity-fan.yaml", ("n1",)),
    ("examples/fidelity-converge.yaml", ("k1", "k2")),
    ("examples/fidelity-halves.yaml", ("h1",)),
    ("examples/fidelity-tiers.yaml", ("t1", "t4")),
    ("examples/fidelity-serial.yaml", ("r1",)),
    ("examples/fidelity-wide.yaml", ("w1",)),
    ("examples/graph-echo-chain.yaml", ("s1",)),
    ("examples/slo.yaml", ("e1",)),
)

Progress = Callable[[str], None]
FidelityRun = Callable[..., dict[str, Any]]


def load_per_core(cores: float) -> float:
    """The host's 1-minute load average per usable core."""
    return round(os.getloadavg()[0] / max(cores, 1.0), 2)


def settle(cores: float, settle_s: float, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait (up to ``settle_s``) for the load to fall to quiet; the load per core it ended at."""
    deadline = time.monotonic() + settle_s
    load = load_per_core(cores)
    while load > QUIET_LOAD_PER_CORE and time.monotonic() < deadline:
        sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
        load = load_per_core(cores)
    return load


def run_set(
    root: str | Path = ".",
    only: Sequence[str] = (),
    repeats: int = 3,
    sim_seeds: int = 20,
    settle_s: float = 60.0,
    progress: Progress | None = None,
    fidelity: FidelityRun | None = None,
    replay: dict[str, Any] | None = None,
    host: str | None = None,
    control: str | None = None,
    host_control_ms: float | None = None,
) -> dict[str, Any]:
    """``bench fidelity`` on each config of :data:`FIDELITY_SET` (``only``: those whose file name
    contains one of these words), paths taken under ``root`` (the repository's checkout); with
    ``replay`` (an earlier output of this function), its recorded runtime runs simulated again;
    ``host`` and ``control``: the twin's host and control models (``bench fidelity --host`` and
    ``--control``; None: their defaults); ``host_control_ms``: the control path's cost for every
    run (``bench fidelity --control-from``; None: each run's own probe's, and the set is also
    simulated again with the constant calibrated on its own runs, under ``host_control``)."""
    from failsoft.bench.fidelity import run as fidelity_run

    fidelity = fidelity or fidelity_run
    if host is not None:
        fidelity = partial(fidelity, host=host)
    if control is not None:
        fidelity = partial(fidelity, control=control)
    if host_control_ms is not None:
        fidelity = partial(fidelity, host_control_ms=host_control_ms)
    if replay is not None:
        result = _replayed(root, only, sim_seeds, replay, progress, fidelity)
    else:
        result = _live(root, only, repeats, sim_seeds, settle_s, progress, fidelity)
    if host_control_ms is None:
        result["host_control"] = _with_host_constant(
            root, only, sim_seeds, result, progress, fidelity, host, control
        )
    return result


def _live(
    root: str | Path,
    only: Sequence[str],
    repeats: int,
    sim_seeds: int,
    settle_s: float,
    progress: Progress | None,
    fidelity: FidelityRun,
) -> dict[str, Any]:
    """Each chosen config run on a live cluster, after the host's load settled."""
    from failsoft.zoo.machine import usable_cores

    chosen = _chosen(only)
    missing = [c for c, _ in chosen if not (Path(root) / c).is_file()]
    if missing:
        raise ConfigError(f"fidelity set configs not found under {str(root)!r}: {', '.join(missing)}")
    cores = float(usable_cores())
    configs: dict[str, Any] = {}
    for config, kill in chosen:
        before = settle(cores, settle_s)
        path = Path(root) / config
        out = fidelity(path, kill=kill, repeats=repeats, sim_seeds=sim_seeds, progress=progress)
        configs[Path(config).stem] = summarize(config, out, before, load_per_core(cores))
    return _result(configs, cores)


def _with_host_constant(
    root: str | Path,
    only: Sequence[str],
    sim_seeds: int,
    result: dict[str, Any],
    progress: Progress | None,
    fidelity: FidelityRun,
    host: str | None,
    control: str | None,
) -> dict[str, Any]:
    """Every config of ``result`` simulated again with the control path's cost as a constant of this
    host, calibrated on the set's own quiet ``bench.yaml`` and ``fidelity.yaml`` runs (what
    ``--control-from`` does with earlier outputs): the set judges the host-constant model on the
    machine it ran on, never with another machine's constant. ``{"calibration": None, "reason"}``
    where the set holds no such run (``--only`` left them out, or they ran on a busy host)."""
    from failsoft.bench import fidelity as fidelity_bench
    from failsoft.runtime.config import load_config

    try:
        calibration = fidelity_bench.calibrate_control(
            [result],
            lambda config: load_config(Path(root) / config),
            host or fidelity_bench.DEFAULT_HOST_MODEL,
            control or fidelity_bench.DEFAULT_CONTROL_MODEL,
        )
    except ConfigError as exc:
        return {"calibration": None, "reason": str(exc)}
    again = _replayed(
        root, only, sim_seeds, result, progress, partial(fidelity, host_control_ms=calibration["ms"])
    )
    return {
        "calibration": calibration,
        "median_mttr_error_pct": again["median_mttr_error_pct"],
        "configs": {
            name: {
                key: config[key]
                for key in ("median_mttr_error_pct", "median_mttr_error_pct_by_kind", "figure")
            }
            for name, config in again["configs"].items()
        },
    }


def _chosen(only: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    chosen = [(c, k) for c, k in FIDELITY_SET if not only or any(w in Path(c).name for w in only)]
    if not chosen:
        names = ", ".join(Path(c).stem for c, _ in FIDELITY_SET)
        raise ConfigError(f"no config of the fidelity set matches {list(only)}; the set: {names}")
    return chosen


def _replayed(
    root: str | Path,
    only: Sequence[str],
    sim_seeds: int,
    earlier: dict[str, Any],
    progress: Progress | None,
    fidelity: FidelityRun,
) -> dict[str, Any]:
    """Each config of ``earlier`` (in the set and chosen by ``only``) simulated again from its
    recorded runtime runs, beside the load it was recorded under."""
    recorded = earlier.get("configs") if isinstance(earlier, dict) else None
    if not isinstance(recorded, dict):
        raise ConfigError("the replayed file is not an output of 'failsoft bench fidelity-set' (no configs)")
    configs: dict[str, Any] = {}
    for config, kill in _chosen(only):
        was = recorded.get(Path(config).stem) or {}
        runs = was.get("detail", {}).get("runtime_runs")
        if not runs:
            continue
        out = fidelity(Path(root) / config, kill=kill, sim_seeds=sim_seeds, progress=progress, runs=runs)
        load = was["loadavg"]
        configs[Path(config).stem] = summarize(config, out, load["per_core_before"], load["per_core_after"])
    if not configs:
        raise ConfigError("the replayed file holds no runtime runs of the chosen configs")
    return _result(configs, float(earlier.get("host", {}).get("usable_cores") or 1.0))


def _result(configs: dict[str, Any], cores: float) -> dict[str, Any]:
    return {
        "configs": configs,
        "median_mttr_error_pct": {
            "quiet": median_of_present([c["figure"] for c in configs.values()]),
            "all": median_of_present([c["median_mttr_error_pct"] for c in configs.values()]),
        },
        "host": {
            "usable_cores": cores,
            "quiet_load_per_core": QUIET_LOAD_PER_CORE,
            "quiet_other_cores": QUIET_OTHER_CORES,
        },
    }


def summarize(config: str, out: dict[str, Any], load_before: float, load_after: float) -> dict[str, Any]:
    """One config's figures beside the contention they ran under (see the module docstring)."""
    groups = [(r.get("host_cpu") or {}).get("other_groups") for r in out.get("runtime_runs", [])]
    others = [sum(float(c) for c in g.values()) for g in groups if g is not None]  # None: not measured
    other_cores = round(statistics.median(others), 2) if others else None
    contended = list(out.get("contended_profiles") or [])
    flagged = []
    if load_before > QUIET_LOAD_PER_CORE:
        flagged.append(f"load {load_before} per core before the runs (quiet: <= {QUIET_LOAD_PER_CORE})")
    if other_cores is not None and other_cores > QUIET_OTHER_CORES:
        busy = f"other work took {other_cores} cores beside the cluster"
        flagged.append(f"{busy} (quiet: <= {QUIET_OTHER_CORES})")
    if contended:
        flagged.append(f"{len(contended)} profiles measured on a busy host")
    mttr = out["median_abs_error_pct"]["mttr"]
    return {
        "config": config,
        "failed": out["failed"],
        "median_mttr_error_pct": mttr,
        "median_first_answer_error_pct": out["median_abs_error_pct"]["first_answer"],
        "median_mttr_error_pct_by_kind": out.get("median_mttr_error_pct_by_kind", {}),
        "runtime_spread_pct": out.get("runtime_spread_pct"),  # the runs' own noise (older outputs: None)
        "figure": None if flagged else mttr,
        "quiet": not flagged,
        "flagged": flagged,
        "loadavg": {"per_core_before": load_before, "per_core_after": load_after},
        "other_busy_cores": other_cores,
        "contended_profiles": contended,
        "detail": out,
    }
