"""``failsoft simulate coding-tail``: ParM's tail-latency figures (section 6.2) on SimPy.

The paper's set-up (section 6.1, and its run configurations, shipped in ``data/parm/run_config``):
``m`` instances of the deployed model (ResNet-18; 12 GPU or 24 CPU instances) behind one frontend;
clients send Poisson arrivals; batch size 1; latency is from the frontend receiving a query to its
prediction coming back (from the deployed model or reconstructed). Three ways to spend the cluster:

* ``parm``: ``m`` data instances and ``m / k`` parity instances. Queries join coding groups in
  arrival order (:class:`~failsoft.policies.coding.groups.GroupFormer`, with the coded service's fill
  timeout); each data query goes at once to the *single* data queue that every data instance pulls
  from (section 6.2.1, "single-queue load balancing", the serving core's ``fifo`` discipline); when a
  group is complete its parity query is encoded and put on the single parity queue. Each group's
  :class:`~failsoft.policies.coding.groups.AnswerTracker` decodes a missing output from the first k
  of the k + 1 answers; the stragglers it names are removed from their queue if still queued (as
  Clipper does; a query already running runs to its end).
* ``equal-resources``: ``m + m / k`` instances, all serving the deployed model from one queue.
* ``none``: ``m`` instances, one queue, no redundancy.

**Service times.** The measured A2 profile of ResNet-18 (``resnet18`` in the shipped profiles,
2.81 ms at batch 1), the deployed model of the paper's latency runs, through the serving core's
:class:`~failsoft.policies.queueing.ServiceModel` with its ``scale`` set to the paper's cluster: the
paper gives no per-query time, only that inference is "tens of milliseconds" (6.2.5) and that its
rates go up to where no redundancy is dominated by queueing (6.2.1); failsoft sets the per-query
time ``S`` so that each cluster's highest rate loads its ``m`` instances to ``top_load`` (0.65):
GPU ``S = 0.65 * 12 / 390 = 20 ms``, CPU ``S = 0.65 * 24 / 240 = 65 ms`` (a c5.xlarge runs
ResNet-18 with JPEG decoding at about that). The parity model has the deployed architecture (4.3) and
the same service time. Service times carry no noise (the profile has none).

**Background load** (section 6.1 "Background traffic", config ``background_traffic``): ``N``
concurrent shuffles; each repeatedly picks two distinct instances at random (any instance: data,
parity or extra) and transfers 128-256 MB (uniform) each way, which takes ``size / link`` at the
cluster's measured instance bandwidth (1.5 Gbps GPU, 4.5 Gbps CPU: the middle of the paper's 1-2
and 4-5 Gbps). What a shuffle does to a query is modelled analytically: an instance in ``s``
shuffles serves each query ``1 + slowdown_per_shuffle * s`` times slower (default 1: the query's
path gets a fair ``1 / (1 + s)`` share of the instance's network against the bulk flows). The
query's rate of progress follows the shuffles as they start and end. The paper does not measure this
factor; it is the model's one free parameter (``--slowdown``).

**Encode and decode** are measured once per run with the real policy code (``time.perf_counter``
around :meth:`AddEncoder.encode` on k 3x224x224 float32 images and :meth:`SubtractionDecoder.decode`
on 1000-class outputs, the paper's sizes, 6.2.5) and added to the parity path: a parity query joins
its queue ``encode`` after its group completes, a decoded output is answered ``decode`` after the
k-th answer. The outputs in the simulation are small random vectors and the parity model's output is
their exact sum, so every reconstruction can be checked against the output it replaces.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from failsoft.errors import ConfigError
from failsoft.policies import registry
from failsoft.policies.coding.groups import AnswerTracker, GroupFormer
from failsoft.policies.coding.interface import Decoder
from failsoft.policies.queueing import Queued, QueueDiscipline, ServiceModel
from failsoft.profiles import load_profile_families
from failsoft.services import CodedParams
from failsoft.sim.output import write_experiment

POLICIES = ("parm", "equal-resources", "none")
FIGURES = ("fig9a", "fig9b", "fig10", "fig11")
PAPER_FIGURE = {"fig9a": "Fig. 10a", "fig9b": "Fig. 10b", "fig10": "Fig. 11", "fig11": "Fig. 12"}
DEPLOYED = "resnet18"  # the paper's latency runs (6.1)
IMAGE_SHAPE = (3, 224, 224)  # the parity query the paper encodes (6.1, 6.2.5)
CLASSES = 1000  # the paper makes its models return 1000 values (6.1)
OUTPUT_SIZE = 4  # floats per simulated output (only the reconstruction check reads them)


@dataclass(frozen=True)
class Cluster:
    """One of the paper's clusters: per-query service time and instance network bandwidth."""

    name: str
    link_gbps: float
    top_rate_qps: float  # the highest rate the paper runs on it (sets the service time)
    data_instances: int


CLUSTERS = {
    "p2.xlarge": Cluster("gpu", 1.5, 390.0, 12),
    "c5.xlarge": Cluster("cpu", 4.5, 240.0, 24),
}


@dataclass(frozen=True)
class CodingTailConfig:
    queries: int = 20_000  # per run (the paper: 100k)
    warmup_queries: int = 204  # the paper's stats skip the first 204 (divisible by 2, 3 and 4)
    top_load: float = 0.65  # utilisation of m instances at a cluster's highest rate (sets S)
    slowdown_per_shuffle: float = 1.0
    shuffle_mb: tuple[float, float] = (128.0, 256.0)
    fill_timeout_ms: float = CodedParams().fill_timeout_ms
    fill: str = CodedParams().fill

    def __post_init__(self) -> None:
        if self.queries <= self.warmup_queries or self.warmup_queries < 0:
            raise ConfigError(
                f"queries ({self.queries!r}) must exceed warmup_queries ({self.warmup_queries!r}) >= 0"
            )
        if not 0 < self.top_load < 1:
            raise ConfigError(f"top_load must be in (0, 1); got {self.top_load!r}")
        if self.slowdown_per_shuffle < 0:
            raise ConfigError(f"slowdown_per_shuffle must be >= 0; got {self.slowdown_per_shuffle!r}")


QUICK = CodingTailConfig(queries=2_000)


@dataclass(frozen=True)
class Point:
    figure: str
    cluster: Cluster
    k: int
    rate_qps: float
    shuffles: int


@dataclass(frozen=True)
class Costs:
    """Encode and decode seconds per coding group, measured with the policy code."""

    encode_s: float
    decode_s: float


def run_configs() -> dict[str, dict[str, Any]]:
    """The shipped run configurations of the paper's figures, by file name."""
    folder = resources.files("failsoft") / "data" / "parm" / "run_config"
    return {name: json.loads((folder / f"{name}.json").read_text()) for name in FIGURES}


def points(figure: str) -> list[Point]:
    """The (k, rate, shuffles) points of one figure, from its run configuration."""
    if figure not in FIGURES:
        raise ConfigError(f"unknown coding-tail figure {figure!r} (known: {', '.join(FIGURES)})")
    config = run_configs()[figure]
    cluster = replace(CLUSTERS[config["worker_type"]], data_instances=int(config["num_models"]))
    return [
        Point(figure, cluster, int(k), float(rate), int(bg))
        for k in config["ec_k_val"]
        for rate in config["send_rates"]
        for bg in config["background_traffic"]
    ]


def service_model(cluster: Cluster, cfg: CodingTailConfig) -> ServiceModel:
    """ResNet-18's measured profile, scaled to the paper's cluster (see the module docstring)."""
    (family,) = load_profile_families(families=["resnet"])
    variant = next(v for v in family.variants if v.name == DEPLOYED)
    target_ms = 1000.0 * cfg.top_load * cluster.data_instances / cluster.top_rate_qps
    return ServiceModel(variant, scale=target_ms / variant.latency_at(1))


def measure_costs(k: int, reps: int = 30) -> Costs:
    """Median seconds of the real encoder (k images) and decoder (1000-class outputs) for one group."""
    rng = np.random.default_rng(0)
    encoder = registry.get_encoder("add", k, 1, IMAGE_SHAPE)
    decoder = registry.get_decoder(k, 1)
    images = [rng.random(IMAGE_SHAPE, dtype=np.float32) for _ in range(k)]
    outputs = {i: rng.random(CLASSES, dtype=np.float32) for i in range(1, k + 1)}  # member 0 missing
    enc, dec = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        encoder.encode(images)
        t1 = time.perf_counter()
        decoder.decode(outputs)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    return Costs(statistics.median(enc), statistics.median(dec))


@dataclass
class _Query:
    id: int
    arrival_s: float
    output: np.ndarray
    answered_s: float | None = None
    answers: int = 0  # how many times the client was answered (must end at exactly 1)
    answer: np.ndarray | None = None  # what the client got: its own output or the reconstruction
    reconstructed: bool = False
    group: int | None = None
    index: int = 0


@dataclass
class _Task:
    """Work on a queue: a data query (``parity`` None) or a group's parity query."""

    query: _Query | None
    group: int
    index: int
    parity: np.ndarray | None = None


@dataclass
class _Run:
    env: simpy.Environment
    rng: np.random.Generator
    point: Point
    policy: str
    cfg: CodingTailConfig
    costs: Costs
    service: ServiceModel
    discipline: QueueDiscipline
    shuffling: list[int]
    serving: list[simpy.Event | None] = field(default_factory=list)  # each instance's service wait
    workers: list[simpy.Process] = field(default_factory=list)
    queues: dict[str, list[Queued]] = field(default_factory=dict)
    idle: dict[str, list[simpy.Event]] = field(default_factory=dict)
    queries: list[_Query] = field(default_factory=list)
    trackers: dict[int, AnswerTracker] = field(default_factory=dict)
    members: dict[int, list[_Query]] = field(default_factory=dict)
    former: GroupFormer | None = None
    decoder: Decoder | None = None
    answered: int = 0
    discarded: int = 0
    max_group_wait_s: float = 0.0
    cancelled: int = 0
    partial_groups: int = 0
    complete_groups: int = 0
    all_answered: simpy.Event | None = None

    def put(self, queue: str, task: _Task) -> None:
        self.queues[queue].append(Queued(task, self.env.now, math.inf))
        if self.idle[queue]:
            self.idle[queue].pop(0).succeed()

    def answer(self, query: _Query, output: np.ndarray, reconstructed: bool) -> None:
        """Answer ``query``'s client, unless it was answered already (a late original or a late
        reconstruction is discarded at the frontend, as Clipper does)."""
        if query.answered_s is not None:
            self.discarded += 1
            return
        query.answers += 1
        query.answered_s, query.answer, query.reconstructed = self.env.now, output, reconstructed
        self.answered += 1
        if self.answered == len(self.queries) and self.all_answered is not None:
            self.all_answered.succeed()


def _instances(policy: str, point: Point) -> tuple[int, int]:
    """(instances pulling the data queue, instances pulling the parity queue)."""
    m = point.cluster.data_instances
    if m % point.k:
        raise ConfigError(f"{m} data instances do not split into coding groups of k={point.k}")
    extra = m // point.k
    return {"parm": (m, extra), "equal-resources": (m + extra, 0), "none": (m, 0)}[policy]


def _worker(run: _Run, instance: int, queue: str) -> Any:
    env = run.env
    while True:
        if not run.queues[queue]:
            wake = env.event()
            run.idle[queue].append(wake)
            yield wake
            continue
        waiting = run.queues[queue]
        batch = run.discipline.next_batch(waiting, env.now, run.service)
        if len(batch.run) == 1 and batch.run[0] is waiting[0]:
            waiting.pop(0)  # fifo, batch 1: the head (the common case, without a scan)
        else:
            taken = {id(q) for q in batch.run}
            run.queues[queue] = [q for q in waiting if id(q) not in taken]
        yield from _serve(run, instance, run.service.batch_s(batch.rows))
        for item in batch.run:
            _done(run, item.key)


def _serve(run: _Run, instance: int, work_s: float) -> Any:
    """Serve ``work_s`` seconds of unslowed work at the rate the instance's shuffles leave it; a
    shuffle starting or ending there interrupts the wait and the rest is re-timed at the new rate."""
    env = run.env
    while True:
        rate = 1.0 / (1.0 + run.cfg.slowdown_per_shuffle * run.shuffling[instance])
        started = env.now
        run.serving[instance] = env.timeout(work_s / rate)
        try:
            yield run.serving[instance]
        except simpy.Interrupt:
            work_s = max(work_s - (env.now - started) * rate, 0.0)
            continue
        run.serving[instance] = None
        return


def _done(run: _Run, task: _Task) -> None:
    """A task's answer reached the frontend."""
    if task.parity is None:
        assert task.query is not None
        run.answer(task.query, task.query.output, reconstructed=False)
        output = task.query.output
    else:
        output = task.parity
    tracker = run.trackers.get(task.group)
    if tracker is None:
        return
    progress = tracker.answered(task.index, output)
    if progress.cancel:
        _cancel(run, task.group, progress.cancel)
    if progress.decoded:
        decoded, group = progress.decoded, task.group
        _after(run, run.costs.decode_s, lambda: _deliver_decoded(run, group, decoded))
    if progress.done:
        del run.trackers[task.group]


def _after(run: _Run, delay_s: float, action: Callable[[], None]) -> None:
    """Call ``action`` after ``delay_s`` of simulated time (a timeout's callback: no process)."""
    run.env.timeout(delay_s).callbacks.append(lambda _event: action())


def _deliver_decoded(run: _Run, group: int, decoded: dict[int, np.ndarray]) -> None:
    for index, output in decoded.items():
        run.answer(run.members[group][index], output, reconstructed=True)


def _cancel(run: _Run, group: int, members: Sequence[int]) -> None:
    """Remove the named members' tasks of ``group`` that are still queued (running ones finish)."""
    gone = set(members)
    for name, queue in run.queues.items():
        kept = [q for q in queue if not (q.key.group == group and q.key.index in gone)]
        run.cancelled += len(queue) - len(kept)
        run.queues[name] = kept


def _send_parity(run: _Run, group: int) -> None:
    """The group's parity query, encoded, joins the parity queue (unless it is no longer needed)."""
    if group in run.trackers:  # still undecided (all k answers may be in already)
        members = run.members[group]
        parity = members[0].output.copy()  # an exact parity model: the sum of the k outputs
        for query in members[1:]:
            parity += query.output
        run.put("parity", _Task(None, group, run.point.k, parity))


def _close(run: _Run, groups: Sequence[Any]) -> None:
    for group in groups:
        run.max_group_wait_s = max(run.max_group_wait_s, group.closed_s - group.opened_s)
        if group.complete:
            run.complete_groups += 1
            _after(run, run.costs.encode_s, partial(_send_parity, run, group.id))
        else:  # released uncoded: its queries are answered by their data instances alone
            run.partial_groups += 1
            run.trackers.pop(group.id, None)


def _poll(run: _Run) -> None:
    assert run.former is not None
    _close(run, run.former.poll(run.env.now))


def _arrivals(run: _Run) -> Any:
    env, rng, former, decoder = run.env, run.rng, run.former, run.decoder
    for i in range(run.cfg.queries):
        yield env.timeout(rng.exponential(1.0 / run.point.rate_qps))
        query = _Query(i, env.now, rng.standard_normal(OUTPUT_SIZE).astype(np.float32))
        run.queries.append(query)
        if former is not None and decoder is not None:
            slot, closed = former.join(i, env.now)
            query.group, query.index = slot.group, slot.index
            if slot.index == 0:
                run.trackers[slot.group] = AnswerTracker(decoder)
                run.members[slot.group] = []
                due = former.next_timeout_s()
                _after(run, max((due or env.now) - env.now, 0.0), lambda: _poll(run))
            run.members[slot.group].append(query)
            run.put("data", _Task(query, slot.group, slot.index))
            _close(run, closed)
        else:
            run.put("data", _Task(query, -1, 0))
    run.all_answered = env.event()
    if run.answered == len(run.queries):
        run.all_answered.succeed()


def _shuffle(run: _Run, instances: int) -> Any:
    """One background shuffle thread: random instance pairs, 128-256 MB each way, back to back."""
    env, rng, cfg = run.env, run.rng, run.cfg
    while True:
        a, b = (int(x) for x in rng.choice(instances, size=2, replace=False))
        megabytes = rng.uniform(*cfg.shuffle_mb)
        _shuffling(run, (a, b), +1)
        yield env.timeout(megabytes * 8.0 / (run.point.cluster.link_gbps * 1000.0))
        _shuffling(run, (a, b), -1)


def _shuffling(run: _Run, instances: Sequence[int], change: int) -> None:
    for i in instances:
        run.shuffling[i] += change
        serving = run.serving[i]
        if serving is not None and not serving.processed:
            run.workers[i].interrupt()  # the query in service there re-times itself


def simulate_point(
    point: Point, policy: str, seed: int, cfg: CodingTailConfig, costs: Costs
) -> tuple[dict[str, Any], list[_Query]]:
    """One run: the row of metrics and the queries (for checks)."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown coding-tail policy {policy!r} (known: {', '.join(POLICIES)})")
    data, parity = _instances(policy, point)
    env = simpy.Environment()
    run = _Run(
        env, np.random.default_rng(seed), point, policy, cfg, costs, service_model(point.cluster, cfg),
        registry.make("queueing", "fifo", 1, None), [0] * (data + parity),
    )  # fmt: skip
    run.serving = [None] * (data + parity)
    run.queues = {"data": [], "parity": []}
    run.idle = {"data": [], "parity": []}
    if policy == "parm":
        run.former = GroupFormer(point.k, cfg.fill_timeout_ms, cfg.fill)
        run.decoder = registry.get_decoder(point.k, 1)  # stateless: one for every group's tracker
    run.workers = [
        env.process(_worker(run, i, "data" if i < data else "parity")) for i in range(data + parity)
    ]
    for _ in range(point.shuffles):
        env.process(_shuffle(run, data + parity))
    arrivals = env.process(_arrivals(run))
    env.run(until=arrivals)
    assert run.all_answered is not None
    env.run(until=run.all_answered)
    measured = run.queries[cfg.warmup_queries :]
    lat = np.array([(q.answered_s or 0.0) - q.arrival_s for q in measured]) * 1000.0
    row = {
        "figure": point.figure, "paper_figure": PAPER_FIGURE[point.figure], "cluster": point.cluster.name,
        "policy": policy, "k": point.k, "rate_qps": point.rate_qps, "shuffles": point.shuffles,
        "seed": seed, "instances": data + parity, "queries": len(measured),
        "latency_p50_ms": float(np.percentile(lat, 50)), "latency_p99_ms": float(np.percentile(lat, 99)),
        "latency_p999_ms": float(np.percentile(lat, 99.9)), "latency_mean_ms": float(lat.mean()),
        "reconstructed_fraction": sum(q.reconstructed for q in measured) / len(measured),
        "cancelled_tasks": run.cancelled, "discarded_answers": run.discarded,
        "partial_groups": run.partial_groups, "max_group_wait_ms": run.max_group_wait_s * 1000.0,
        "complete_groups": run.complete_groups, "service_ms": run.service.batch_s(1) * 1000.0,
        "encode_us": costs.encode_s * 1e6, "decode_us": costs.decode_s * 1e6,
    }  # fmt: skip
    return row, run.queries


@dataclass(frozen=True)
class Sweep:
    figures: tuple[str, ...] = FIGURES
    policies: tuple[str, ...] = POLICIES
    seeds: int = 1
    rates_per_figure: int | None = None  # None: every rate of the run config


def sweep_points(sweep: Sweep) -> list[Point]:
    out = []
    for figure in sweep.figures:
        pts = points(figure)
        if sweep.rates_per_figure is not None and len(pts) > sweep.rates_per_figure:
            step = (len(pts) - 1) / max(sweep.rates_per_figure - 1, 1)
            pts = [pts[round(i * step)] for i in range(sweep.rates_per_figure)]
        out.extend(pts)
    return out


def run_sweep(
    sweep: Sweep, cfg: CodingTailConfig, on_row: Callable[[dict[str, Any]], None] | None = None
) -> tuple[list[dict[str, Any]], dict[int, Costs]]:
    costs: dict[int, Costs] = {}
    rows = []
    for point in sweep_points(sweep):
        if point.k not in costs:
            costs[point.k] = measure_costs(point.k)
        for seed in range(sweep.seeds):
            for policy in sweep.policies:
                row, _ = simulate_point(point, policy, seed, cfg, costs[point.k])
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows, costs


def _axis(figure: str) -> str:
    return {"fig9a": "rate_qps", "fig9b": "rate_qps", "fig10": "k", "fig11": "shuffles"}[figure]


def summarize(
    rows: Sequence[dict[str, Any]], cfg: CodingTailConfig, costs: dict[int, Costs], wall_s: float
) -> dict[str, Any]:
    """Per figure and point: each policy's latency percentiles (median over seeds, as the paper
    reports the median of its runs), and ParM against Equal-Resources."""
    by: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["figure"], row[_axis(row["figure"])], row["policy"]), []).append(row)
    metrics = ("latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "reconstructed_fraction")
    figures: dict[str, Any] = {}
    for (figure, x, policy), group in by.items():
        entry = figures.setdefault(
            figure, {"paper_figure": PAPER_FIGURE[figure], "axis": _axis(figure), "points": {}}
        )
        point = entry["points"].setdefault(str(x), {"x": x})
        point[policy] = {m: round(statistics.median(r[m] for r in group), 4) for m in metrics}
        point[policy]["seeds"] = len(group)
    for entry in figures.values():
        for point in entry["points"].values():
            parm, er = point.get("parm"), point.get("equal-resources")
            if parm and er:
                point["p999_reduction_pct"] = round(
                    100.0 * (1.0 - parm["latency_p999_ms"] / er["latency_p999_ms"]), 2
                )
                point["p50_change_pct"] = round(
                    100.0 * (parm["latency_p50_ms"] / er["latency_p50_ms"] - 1), 2
                )
                gap_parm = parm["latency_p999_ms"] - parm["latency_p50_ms"]
                gap_er = er["latency_p999_ms"] - er["latency_p50_ms"]
                point["gap_ratio"] = round(gap_er / gap_parm, 3) if gap_parm > 0 else None
        entry["points"] = list(entry["points"].values())
    return {
        "experiment": "coding-tail",
        "config": asdict(cfg),
        "service_ms": {
            c.name: round(service_model(c, cfg).batch_s(1) * 1000.0, 3) for c in CLUSTERS.values()
        },
        "encode_us_p50": {str(k): round(c.encode_s * 1e6, 2) for k, c in costs.items()},
        "decode_us_p50": {str(k): round(c.decode_s * 1e6, 2) for k, c in costs.items()},
        "wall_s": round(wall_s, 2),
        "figures": figures,
    }


def write_outputs(rows: Sequence[dict[str, Any]], summary: dict[str, Any], out_dir: Path) -> dict[str, str]:
    names = list(rows[0]) if rows else ["figure"]
    plot = partial(_plot, summary)
    return write_experiment(rows, names, summary, out_dir, "coding-tail.png", plot)


STYLE = {
    "parm": ("ParM", "#1f77b4"),
    "equal-resources": ("Equal-Resources", "#ff7f0e"),
    "none": ("No redundancy", "#7f7f7f"),
}
XLABEL = {"rate_qps": "query rate (qps)", "k": "k", "shuffles": "background shuffles"}


def _plot(summary: dict[str, Any], path: Path) -> None:
    """One panel per figure: p99.9 (solid) and median (dashed) latency per policy against its axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = summary["figures"]
    fig, axes = plt.subplots(1, len(figures), figsize=(3.6 * len(figures), 3.2), squeeze=False)
    for ax, (name, entry) in zip(axes[0], figures.items(), strict=True):
        pts = sorted(entry["points"], key=lambda p: p["x"])
        for policy, (label, color) in STYLE.items():
            have = [p for p in pts if policy in p]
            if not have:
                continue
            xs = [p["x"] for p in have]
            ax.plot(
                xs,
                [p[policy]["latency_p999_ms"] for p in have],
                "-o",
                color=color,
                ms=3,
                label=f"{label} p99.9",
            )
            ax.plot(
                xs, [p[policy]["latency_p50_ms"] for p in have], "--", color=color, label=f"{label} median"
            )
        if entry["axis"] != "rate_qps":
            ax.set_xticks([p["x"] for p in pts])
        ax.set_title(f"{entry['paper_figure']} ({name})", fontsize=9)
        ax.set_xlabel(XLABEL[entry["axis"]])
        ax.set_ylabel("latency (ms)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
