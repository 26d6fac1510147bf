"""``failsoft bench replication CONFIG``: HAMS's primary-backup (``nspb``) against Remus's
(``stop-and-copy``) and no replication (``none``) on a real cluster, per graph service and policy.

Every ``graph`` service of the config with a stateful node is measured, each policy on a fresh
cluster started from the config with the service's ``params.replication`` set to it (the other
services deployed as configured). One client sends requests one at a time (closed loop: a stateful
graph's answers depend on their order), each the next value of the entry model's example stream
(the SP500 series for the GRUs):

1. ``warmup`` requests, not measured; then ``requests`` failure-free ones: ``latency_ms.{p50,p99}``
   (client side, end to end), and ``overhead_pct``, nspb's p50 over none's, in percent;
2. the server of the killed node's primary (``kill_node``, by default the first stateful node in
   the graph's order; its app's configured primary server) is killed (``failsoft chaos kill``), and
   ``after_kill`` more requests are sent: ``recovery_ms`` is the time from the kill to the first
   answer (the first request after the kill finds the dead primary), ``failed_requests`` the
   requests that got an error, before or after;
3. the policies take turns, ``rounds`` clusters each (nspb, none, then none, nspb, ...: the drift
   of a shared machine spread evenly), and each policy's requests are pooled;
4. ``consistent``: every answer (before and after the kill) equals, bit for bit, the failure-free
   run computed in this process: the same models from their initial states, walked through the
   graph in ``seq`` order, one torch thread as the agents run (the models are deterministic on
   CPU). ``mismatched`` counts the answers that differ, ``first_mismatch_seq`` the first of each
   run; with nspb, ``durable_again_ms`` is the time from the kill until every stateful node's
   backup holds its state after the last request (a killed backup replaced).

``ship_interval_ms`` (default: the config's) sets the graphs' spacing of state transfers (0: one
after every request, as HAMS ships).

``stop-and-copy`` is Remus's primary-backup: a stateful node's output is held until the state after
it is applied at the backup (the primary computing on meanwhile), so every stateful hop of a request
waits for one transfer; it always ships after every request (``ship_interval_ms`` 0: a spaced
transfer would hold every output for up to an interval).

The targets: nspb's overhead <= 4 %, its recovery <= 250 ms, nspb consistent, none not (it loses
the killed node's state).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.bench.cluster import read_bench_config, with_service_params
from failsoft.bench.models import ensure_config_models
from failsoft.errors import ConfigError, FailsoftError

POLICIES = ("nspb", "stop-and-copy", "none")
TARGET_OVERHEAD_PCT = 4.0
TARGET_RECOVERY_MS = 250.0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReplicationBenchSettings:
    policies: tuple[str, ...] = POLICIES
    requests: int = 150  # failure-free, measured
    warmup: int = 20
    after_kill: int = 30
    kill_node: str | None = None  # default: each graph's first stateful node
    ship_interval_ms: float | None = None  # the graphs' state transfer spacing (default: the config's)
    rounds: int = 2  # clusters per policy, the policies alternating (drift on a shared machine)
    timeout_s: float = 20.0  # per request: a slow shared machine is no failure
    root: str | None = None  # model repository (default: the config's)

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ConfigError(f"unknown replication policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
        if not self.policies:
            raise ConfigError("no replication policy to run")
        if self.requests < 2 or self.after_kill < 1 or self.warmup < 0:
            raise ConfigError(
                f"requests must be >= 2, after_kill >= 1 and warmup >= 0; "
                f"got {self.requests}, {self.after_kill}, {self.warmup}"
            )
        if self.ship_interval_ms is not None and not 0 <= self.ship_interval_ms <= 60_000:
            raise ConfigError(f"ship_interval_ms must be in [0, 60000], got {self.ship_interval_ms!r}")
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {self.timeout_s!r}")


@dataclass(frozen=True, slots=True)
class Shot:
    """One request as the bench's client saw it: ``sent``/``done`` (perf_counter s), its ``seq``."""

    index: int  # which input (0-based, in sending order)
    sent: float
    done: float
    seq: int | None  # None: it failed
    outputs: np.ndarray | None = None
    error: str | None = None

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000.0


@dataclass(frozen=True)
class Run:
    """One cluster's run of one policy: its shots, when the kill was, the failure-free answers."""

    shots: Sequence[Shot]
    killed_at: float
    expected: Sequence[np.ndarray]
    replication: Any = None  # the service's replication entry at the end
    durable_again_ms: float | None = None  # from the kill until every backup holds the last state


@dataclass(frozen=True)
class GraphPlan:
    """A graph service to measure: its nodes' models and the server the bench kills."""

    service: str
    kill_node: str
    kill_server: str
    stateful: tuple[str, ...]
    models: Mapping[str, tuple[str, str]]  # node -> (family, variant)
    on_killed_server: tuple[str, ...]  # the graph's nodes whose primary is on the killed server
    entry: str  # the entry node whose model's example stream the requests are


def run(
    config_path: str | Path, settings: ReplicationBenchSettings, progress: Progress | None = None
) -> dict[str, Any]:
    say = progress or (lambda _: None)
    path = Path(config_path)
    data, plans = bench_config(path, settings)
    ensure_config_models(path, data, say)
    graphs: dict[str, Any] = {}
    for plan in plans:
        runs: dict[str, list[Run]] = {p: [] for p in settings.policies}
        for r in range(settings.rounds):
            order = settings.policies if r % 2 == 0 else tuple(reversed(settings.policies))
            for policy in order:
                say(f"graph {plan.service}, round {r + 1}/{settings.rounds}, policy {policy}: starting")
                runs[policy].append(_run_policy(path, data, plan, policy, settings, say))
        n_before = settings.warmup + settings.requests
        policies = {p: summary(runs[p], settings.warmup, n_before) for p in settings.policies}
        params = next(s for s in data["services"] if s.get("name") == plan.service).get("params") or {}
        interval = settings.ship_interval_ms
        graphs[plan.service] = {
            "ship_interval_ms": float(params.get("ship_interval_ms", 0.0) if interval is None else interval),
            "kill": {"node": plan.kill_node, "server": plan.kill_server},
            "nodes_on_killed_server": list(plan.on_killed_server),
            "policies": with_overhead(policies),
        }
    return {
        "config": str(path),
        "settings": asdict(settings),
        "load": (
            "one client, requests one at a time; each the next value of the entry model's example "
            f"stream (the SP500 series for the GRUs); {settings.rounds} cluster(s) per policy, the "
            "policies alternating, their requests pooled"
        ),
        "graphs": graphs,
        "targets": targets_met(graphs),
    }


# the config ----------------------------------------------------------------------------------------
def bench_config(path: Path, settings: ReplicationBenchSettings) -> tuple[dict[str, Any], list[GraphPlan]]:
    """The config as a dict (gateway on a free port, the repository if given) and one plan per graph
    service with a stateful node."""
    data = read_bench_config(path, settings.root)
    return data, plans_of(data, settings.kill_node, str(path))


def plans_of(data: Mapping[str, Any], kill_node: str | None, source: str) -> list[GraphPlan]:
    from failsoft.graphs import graph_from_document
    from failsoft.policies.replication.interface import Topology

    apps = {a["name"]: a for a in data.get("apps") or []}
    plans = []
    for s in data.get("services") or []:
        if s.get("mode") != "graph":
            continue
        graph = graph_from_document(s.get("params") or {}, f"{source}: service {s.get('name')!r}")
        topology = Topology(graph)
        stateful = tuple(n for n in topology.order if n in topology.stateful)
        if not stateful:
            continue
        node = kill_node or stateful[0]
        if node not in stateful:
            raise ConfigError(
                f"{source}: service {s['name']!r}: kill node {node!r} is not one of its stateful nodes "
                f"{list(stateful)}"
            )
        models, homes = {}, {}
        for n in graph.nodes:
            app = apps.get(n.app)
            if app is None or not app.get("primary"):
                raise ConfigError(f"{source}: graph node {n.name!r} needs an app with a primary placement")
            models[n.name] = (str(app["family"]), n.variant or str(app["primary"]["variant"]))
            homes[n.name] = str(app["primary"]["server"])
        server = homes[node]
        shared = tuple(n for n in topology.order if homes[n] == server)
        plans.append(GraphPlan(str(s["name"]), node, server, stateful, models, shared, topology.entries[0]))
    if not plans:
        raise ConfigError(f"{source}: bench replication needs a graph service with a stateful node")
    return plans


def policy_config(
    data: Mapping[str, Any], service: str, policy: str, ship_interval_ms: float | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {"replication": policy}
    if ship_interval_ms is not None:
        params["ship_interval_ms"] = ship_interval_ms
    if policy == "stop-and-copy":  # Remus ships the state of every output it holds
        params["ship_interval_ms"] = 0.0
    return with_service_params(data, service, **params)


# one cluster ---------------------------------------------------------------------------------------
def _run_policy(
    path: Path,
    data: dict[str, Any],
    plan: GraphPlan,
    policy: str,
    settings: ReplicationBenchSettings,
    say: Progress,
) -> Run:
    from failsoft.bench.cluster import wait_home
    from failsoft.runtime.config import config_from_dict
    from failsoft.runtime.session import Session

    with tempfile.TemporaryDirectory(prefix="failsoft-bench-replication-") as state:
        cfg = policy_config(data, plan.service, policy, settings.ship_interval_ms)
        cfg["state_dir"] = state
        config = config_from_dict(cfg, source=str(path), base_dir=path.parent)
        repo_root = str(config.repository)
        (graph_service,) = [s for s in config.services if s.name == plan.service]
        with Session(config, num_cpus=2) as session:
            assert session.prepared is not None
            client = session.client(timeout=settings.timeout_s + 10)
            try:
                wait_home(client)
                if policy != "none":
                    _wait_backups(client, plan)
                inputs = stream_inputs(repo_root, plan, settings)
                n_before = settings.warmup + settings.requests
                say(f"graph {plan.service}, policy {policy}: {n_before} requests, then the kill")
                shots = [_send(client, plan.service, i, inputs[i], settings) for i in range(n_before)]
                client.admin("kill", server=plan.kill_server)
                killed_at = time.perf_counter()
                shots += [
                    _send(client, plan.service, i, inputs[i], settings)
                    for i in range(n_before, n_before + settings.after_kill)
                ]
                last = max((s.seq for s in shots if s.seq is not None), default=0)
                durable_ms = _wait_durable(client, plan, last, killed_at) if policy != "none" else None
                entry = next(e for e in client.repository_index() if e["name"] == plan.service)
            finally:
                client.close()
    expected = graph_reference(repo_root, graph_service.params, plan, [inputs[s.index] for s in shots])
    return Run(shots, killed_at, expected, entry.get("replication"), durable_ms)


def _replication_nodes(client: Any, plan: GraphPlan) -> dict[str, Any]:
    entry = next(e for e in client.repository_index() if e["name"] == plan.service)
    return dict((entry.get("replication") or {}).get("nodes") or {})


def _wait_backups(client: Any, plan: GraphPlan, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = _replication_nodes(client, plan)
        if all((nodes.get(n) or {}).get("backup_holds") is not None for n in plan.stateful):
            return
        time.sleep(0.2)
    raise FailsoftError(f"service {plan.service!r}: the backups were not placed within {timeout_s:.0f} s")


def _wait_durable(
    client: Any, plan: GraphPlan, last: int, killed_at: float, timeout_s: float = 30.0
) -> float | None:
    """Ms from the kill until every stateful node's backup holds its state after request ``last``
    (a killed backup replaced, the newest state applied); None if not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = _replication_nodes(client, plan)
        if all((nodes.get(n) or {}).get("backup_holds") == last for n in plan.stateful):
            return round((time.perf_counter() - killed_at) * 1000.0, 1)
        time.sleep(0.05)
    return None


def _send(client: Any, service: str, index: int, x: np.ndarray, settings: ReplicationBenchSettings) -> Shot:
    sent = time.perf_counter()
    try:
        answer = client.infer(service, x, timeout=settings.timeout_s)
    except FailsoftError as exc:
        return Shot(index, sent, time.perf_counter(), None, error=f"{type(exc).__name__}: {exc}"[:200])
    done = time.perf_counter()
    return Shot(index, sent, done, int(answer.raw["parameters"]["seq"]), np.asarray(answer.outputs))


def stream_inputs(root: str, plan: GraphPlan, settings: ReplicationBenchSettings) -> list[np.ndarray]:
    """The requests: the entry model's example stream, one row each (cycled if too short)."""
    from failsoft.zoo import ModelRepository

    family, variant = plan.models[plan.entry]
    model = ModelRepository(root).load(family, variant, "cpu")
    rows = np.asarray(model.example_batch(500), dtype=np.float32)
    total = settings.warmup + settings.requests + settings.after_kill
    return [rows[i % len(rows)][None] for i in range(total)]


# the failure-free run ------------------------------------------------------------------------------
def graph_reference(root: str, graph: Any, plan: GraphPlan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The graph's answers to ``inputs`` in order (``seq`` 1, 2, ...), every node's model fresh."""
    import torch

    from failsoft.zoo import ModelRepository

    repo = ModelRepository(root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the agents run (agents.torch_threads)
    try:
        models = {n: repo.load(f, v, "cpu") for n, (f, v) in plan.models.items()}
        return walk_graph(graph, {n: m.predict for n, m in models.items()}, inputs)
    finally:
        torch.set_num_threads(threads)


def walk_graph(
    graph: Any, compute: Mapping[str, Callable[[np.ndarray], np.ndarray]], inputs: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """What the graph dispatcher answers, request by request: entry nodes take the request, a node
    its upstream's output, a fan-in its inputs side by side (``joins`` order), sinks side by side."""
    from failsoft.policies.replication.interface import Topology

    topology = Topology(graph)
    joins = {n.name: n.joins for n in graph.nodes}
    answers = []
    for x in inputs:
        out: dict[str, np.ndarray] = {}
        for node in topology.order:
            ups = list(joins[node] or topology.inputs[node])
            batch = x if not ups else np.concatenate([out[u] for u in ups], axis=-1)
            out[node] = np.asarray(compute[node](batch))
        sinks = [out[s] for s in topology.sinks]
        answers.append(sinks[0] if len(sinks) == 1 else np.concatenate(sinks, axis=-1))
    return answers


# summaries -----------------------------------------------------------------------------------------
def summary(runs: Sequence[Run], warmup: int, n_before: int) -> dict[str, Any]:
    """One policy's figures from its runs, pooled: the failure-free latencies of every run,
    ``recovery_ms`` the median over the runs (each run's in ``recovery_ms_each``), ``consistent``
    only if every run's answers (shots in ``seq`` order: sent one at a time) equal ``expected`` and
    none was lost after the kill."""
    measured = [s.latency_ms for r in runs for s in r.shots[warmup:n_before] if s.seq is not None]
    after_kill: list[float] = []
    recoveries: list[float | None] = []
    mismatched: list[int] = []
    first_mismatch: list[int] = []
    consistent = bool(runs)
    for run in runs:
        after = [s for s in run.shots[n_before:] if s.seq is not None]
        after_kill += [s.latency_ms for s in after[1:]]
        recoveries.append(round((after[0].done - run.killed_at) * 1000.0, 2) if after else None)
        bad = [
            i + 1
            for i, s in enumerate(run.shots)
            if s.outputs is not None and not np.array_equal(s.outputs, np.asarray(run.expected[i]))
        ]
        mismatched += bad
        first_mismatch += bad[:1]
        consistent = consistent and not bad and len(after) == len(run.shots[n_before:])
    known = [r for r in recoveries if r is not None]
    shots = [s for r in runs for s in r.shots]
    return {
        "requests": len(shots),
        "runs": len(runs),
        "latency_ms": _percentiles(measured),
        "latency_after_kill_ms": _percentiles(after_kill),
        "recovery_ms": round(float(np.median(known)), 2) if known else None,
        "recovery_ms_each": recoveries,
        "failed_requests": sum(s.seq is None for s in shots),
        "errors": sorted({s.error for s in shots if s.error})[:3],
        "consistent": consistent,
        "mismatched": len(mismatched),
        "mismatched_before_kill": sum(i <= n_before for i in mismatched),
        "first_mismatch_seq": first_mismatch,
        "durable_again_ms": [r.durable_again_ms for r in runs],
        "replication_at_end": [r.replication for r in runs],
    }


def with_overhead(policies: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each policy's ``overhead_pct``: its failure-free p50 over ``none``'s, in percent."""
    base = (policies.get("none") or {}).get("latency_ms", {}).get("p50")
    out = {}
    for name, figures in policies.items():
        p50 = figures.get("latency_ms", {}).get("p50")
        overhead = round((p50 / base - 1.0) * 100.0, 2) if base and p50 is not None else None
        out[name] = {"overhead_pct": overhead, **figures}
    return out


def targets_met(graphs: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "overhead_pct_max": TARGET_OVERHEAD_PCT,
        "recovery_ms_max": TARGET_RECOVERY_MS,
    }
    for name, g in graphs.items():
        nspb, none = g["policies"].get("nspb"), g["policies"].get("none")
        met: dict[str, Any] = {}
        if nspb is not None:
            o, r = nspb.get("overhead_pct"), nspb.get("recovery_ms")
            met["nspb_overhead"] = None if o is None else o <= TARGET_OVERHEAD_PCT
            met["nspb_recovery"] = None if r is None else r <= TARGET_RECOVERY_MS
            met["nspb_consistent"] = bool(nspb.get("consistent"))
        if none is not None:
            met["none_inconsistent_after_failure"] = not none.get("consistent")
        sac = g["policies"].get("stop-and-copy")
        if nspb is not None and sac is not None:
            ours, theirs = nspb["latency_ms"]["p50"], sac["latency_ms"]["p50"]
            met["nspb_p50_below_stop_and_copy"] = None if None in (ours, theirs) else ours < theirs
        out[name] = met
    return out


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    return {
        "p50": round(float(np.percentile(values, 50)), 2),
        "p99": round(float(np.percentile(values, 99)), 2),
    }
