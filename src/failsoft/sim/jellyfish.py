"""``failsoft simulate jellyfish``: the paper's client sets over the three bandwidth traces (SimPy).

Per run: ``clients`` send frames at their frame rate for ``duration_s``; each frame crosses the
client's uplink, whose bandwidth follows the trace (every client starts at its own random offset, as
the public shaping script does; frames queue behind each other on the uplink), reaches the server
after half the round trip, waits in a serving queue, runs in a batch and comes back after the server
overhead and the other half of the round trip. A frame *misses* if it is dropped or answered after
its SLO.

The client is the public one: the server acks each frame on arrival; the ack's round trip feeds the
client's :class:`UplinkEstimator`, whose estimate rides on the next frame to the server's
:class:`BandwidthWindow`; each frame goes out at the largest size, up to the one the server asked
for last, that this estimate carries at the client's frame rate ("best backoff",
``carried_frame_rung``). The ladder has, besides EfficientNet B0-B7, low-resolution feeds of B0
(``low_res_px``: 128, 160, 192 px frames upscaled on the server, at B0's cost and a declared
accuracy): the paper's client sends "the maximum possible size" when the network cannot carry the
model's (section 3.1), and its smallest frame is 128 px. ``client_backoff=False, low_res_px=()``
gives the earlier model (estimates fed by answers only, frames never below 224 px).

* ``jellyfish``: the controller re-plans every ``replan_s`` (0.5 s) with the adaptation policy, from
  each client's server-side estimate; each worker runs its rung with fixed-size batches and lazy
  drop (the ``batch-lazy-drop`` discipline), and every answer tells the client the frame size to send
  next (``next_frame_rung``). An unmapped client's frames are dropped at once, as the public server
  does (the paper, section 8, leaves such clients to local execution).
* ``edf-small|medium|large``: every worker runs the smallest, middle or largest *model* (a
  low-resolution feed is not a variant of its own); all frames share one EDF queue with lazy drop;
  the client asks for that model's input size and backs off the same way (section 7.3: the
  baselines adapt the frame size too, on throughput alone).

Simplifications (said in docs/jellyfish.md): variant switches take effect at once (the paper keeps
the neighbouring variants resident on the GPU); a frame smaller than its model's input scores the
smaller rung's accuracy (the upscaled frame carries no more detail); service times are the
ladder's profiled latencies, without noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from failsoft.adaptation_data import (
    DEFAULT_BATCH_COST,
    LOW_RES_PX,
    Trace,
    bundled_client_set,
    bundled_trace,
    efficientnet_ladder,
)
from failsoft.policies import registry
from failsoft.policies.adaptation.model import ClientSnapshot, Ladder, Plan, Snapshot
from failsoft.policies.adaptation.network import (
    BandwidthWindow,
    UplinkEstimator,
    carried_frame_rung,
    latency_budgets_ms,
    next_frame_rung,
    server_deadline_s,
)
from failsoft.policies.queueing import Queued, QueueDiscipline, ServiceModel
from failsoft.sim.output import write_experiment

POLICIES = ("jellyfish", "edf-small", "edf-medium", "edf-large")
TRACES = ("synthetic", "wifi", "lte")
CLIENT_COUNTS = (1, 2, 4, 8)
FPS = ("15", "25")
SLOS = ("75", "100", "150")


@dataclass(frozen=True)
class JellyfishSimConfig:
    duration_s: float = 30.0
    workers: int = 2  # the paper's testbed: 2 GPUs
    rtt_ms: float = 1.0
    overhead_ms: float = 4.0  # 2 x dispatch + pre-processing + noise, the public server's start values
    replan_s: float = 0.5
    max_batch: int = 8
    # frames below EfficientNet-B0's 224 px a client may send in a bandwidth dip (upscaled on the
    # server, at a declared accuracy cost: adaptation_data.upscaled_accuracy); () = none
    low_res_px: tuple[int, ...] = LOW_RES_PX
    # the public client: its bandwidth estimate is fed by the server's ack of each frame (sent on
    # arrival), piggybacked on its next frame, and each frame is sent at the largest size up to the
    # one the server asked for that this estimate carries ("best backoff"). False: the estimate is fed
    # by the answers only and the client sends what the last answer asked for.
    client_backoff: bool = True


@dataclass
class _Frame:
    client: int
    sent_s: float
    rung: int
    kbit: float
    arrive_s: float = 0.0
    bw_kbps: float | None = None  # the client's estimate, piggybacked on the frame


@dataclass
class _Run:
    """One run's mutable state (SimPy processes share it)."""

    env: simpy.Environment
    ladder: Ladder
    cfg: JellyfishSimConfig
    clients: tuple[tuple[float, float], ...]  # (slo_ms, fps)
    policy: str
    windows: list[BandwidthWindow]
    estimators: list[UplinkEstimator]
    next_rung: list[int]  # the frame size the server asked for last
    client_bw: list[float]  # the client's own estimate (kbps): its registration value, then measured
    worker_rung: list[int]
    worker_batch: list[int]
    worker_of: dict[int, int] = field(default_factory=dict)
    queues: list[list[Queued]] = field(default_factory=list)
    wakeups: list[simpy.Event] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    frames: int = 0
    dropped: int = 0
    unmapped: int = 0  # of the dropped: the client had no worker (no variant fits its budget)
    late: int = 0
    upscaled: int = 0  # of the in-time answers: frames smaller than the smallest model's input


def _client(run: _Run, c: int, trace: Trace, offset_s: float, phase_s: float) -> Any:
    fps = run.clients[c][1]
    env, ladder = run.env, run.ladder
    yield env.timeout(phase_s)
    uplink_free = 0.0
    while env.now < run.cfg.duration_s:
        rung = run.next_rung[c]
        bw = None
        if run.cfg.client_backoff:
            bw = run.client_bw[c]
            rung = carried_frame_rung(ladder, rung, fps, bw)
        frame = _Frame(c, env.now, rung, ladder.rungs[rung].frame_kbit, bw_kbps=bw)
        start = max(env.now, uplink_free)
        transfer_s = frame.kbit / (trace.at(start, offset_s) * 1000.0)
        uplink_free = start + transfer_s
        frame.arrive_s = uplink_free + run.cfg.rtt_ms / 2000.0
        run.frames += 1
        env.process(_deliver(run, frame))
        yield env.timeout(1.0 / fps)


def _deliver(run: _Run, frame: _Frame) -> Any:
    env, c = run.env, frame.client
    yield env.timeout(frame.arrive_s - env.now)
    if frame.bw_kbps is not None:
        run.windows[c].report(env.now, frame.bw_kbps)
    slo_ms = run.clients[c][0]
    if run.policy == "jellyfish":
        k = run.worker_of.get(c)
        if k is None:
            run.unmapped += 1
            _answer(run, frame, None, env.now)
    else:
        k = 0  # one shared EDF queue
    if k is not None:
        bw = run.windows[c].estimate(env.now)
        deadline = server_deadline_s(env.now, slo_ms, frame.kbit, bw, run.cfg.rtt_ms, run.cfg.overhead_ms)
        run.queues[k].append(Queued(frame, env.now, deadline))
        if not run.wakeups[k].triggered:
            run.wakeups[k].succeed()
    if run.cfg.client_backoff:  # the ack reaches the client after the way back
        yield env.timeout(run.cfg.rtt_ms / 2000.0)
        kbps = run.estimators[c].observe(frame.kbit, (env.now - frame.sent_s) * 1000.0, 0.0)
        if kbps is not None:
            run.client_bw[c] = kbps


def _worker(run: _Run, w: int, discipline: Callable[[int], QueueDiscipline]) -> Any:
    env = run.env
    k = w if run.policy == "jellyfish" else 0
    while True:
        if not run.queues[k]:
            run.wakeups[k] = env.event()
            yield run.wakeups[k]
            continue
        rung = run.worker_rung[w]
        service = ServiceModel(run.ladder.rungs[rung].variant, DEFAULT_BATCH_COST)
        batch = discipline(run.worker_batch[w]).next_batch(run.queues[k], env.now, service)
        taken = {id(q) for q in (*batch.run, *batch.drop)}
        run.queues[k] = [q for q in run.queues[k] if id(q) not in taken]
        for q in batch.drop:
            _answer(run, q.key, None, env.now)
        if batch.run:
            yield env.timeout(service.batch_s(batch.rows))
            for q in batch.run:
                _answer(run, q.key, (rung, w), env.now)


def _answer(run: _Run, frame: _Frame, served: tuple[int, int] | None, done_s: float) -> None:
    """The client gets the answer: account it, feed the bandwidth estimators, adapt the frame size."""
    cfg, c = run.cfg, frame.client
    slo_ms, fps = run.clients[c]
    back_s = done_s + (cfg.overhead_ms + cfg.rtt_ms / 2) / 1000.0
    e2e_ms = (back_s - frame.sent_s) * 1000.0
    if served is None:
        run.dropped += 1
    elif e2e_ms > slo_ms:
        run.late += 1
    else:
        run.latencies_ms.append(e2e_ms)
        run.accuracies.append(float(run.ladder.accuracy[min(frame.rung, served[0])]))
        run.upscaled += run.ladder.rungs[frame.rung].upscaled
    if not cfg.client_backoff:
        kbps = run.estimators[c].observe(
            frame.kbit, e2e_ms, (done_s - frame.arrive_s) * 1000.0 + cfg.overhead_ms
        )
        if kbps is not None:
            run.windows[c].report(run.env.now, kbps)
    bw = run.windows[c].estimate(run.env.now)
    if run.policy != "jellyfish":
        top = run.worker_rung[0]  # with client_backoff, the client picks the frame its uplink carries
        run.next_rung[c] = top if cfg.client_backoff else carried_frame_rung(run.ladder, top, fps, bw)
    else:
        k = run.worker_of.get(c)
        rung = run.worker_rung[k] if k is not None else None
        batch = run.worker_batch[k] if k is not None else 0
        run.next_rung[c] = next_frame_rung(
            run.ladder, rung, batch, slo_ms, fps, bw, cfg.rtt_ms, cfg.overhead_ms
        )


def _controller(run: _Run, policy: Any) -> Any:
    env, cfg = run.env, run.cfg
    workers = tuple(f"w{k}" for k in range(cfg.workers))
    while True:
        snap_clients = []
        for c, (slo_ms, fps) in enumerate(run.clients):
            bw = run.windows[c].estimate(env.now)
            budgets = latency_budgets_ms(run.ladder, slo_ms, fps, bw, cfg.rtt_ms, cfg.overhead_ms)
            snap_clients.append(ClientSnapshot(str(c), fps, budgets))
        plan: Plan = policy.plan(Snapshot(run.ladder, tuple(snap_clients), workers, tuple(run.worker_rung)))
        run.worker_of = {}
        for k, wp in enumerate(plan.workers):
            run.worker_rung[k], run.worker_batch[k] = wp.rung, max(wp.batch, 1)
            for name in wp.clients:
                run.worker_of[int(name)] = k
        for c, (slo_ms, fps) in enumerate(run.clients):
            k = run.worker_of.get(c)
            bw = run.windows[c].estimate(env.now)
            rung = run.worker_rung[k] if k is not None else None
            batch = run.worker_batch[k] if k is not None else 0
            run.next_rung[c] = next_frame_rung(
                run.ladder, rung, batch, slo_ms, fps, bw, cfg.rtt_ms, cfg.overhead_ms
            )
        yield env.timeout(cfg.replan_s)


def simulate_run(
    ladder: Ladder,
    clients: Sequence[tuple[float, float]],
    trace: Trace,
    policy_name: str,
    seed: int,
    cfg: JellyfishSimConfig,
) -> dict[str, Any]:
    """One client set on one trace under one policy: miss rate, accuracy, latency, drops."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    n = len(clients)
    offsets = [float(rng.uniform(0, len(trace.mbps) * trace.step_s)) for _ in range(n)]
    phases = [float(rng.uniform(0, 1.0 / fps)) for _, fps in clients]
    windows = [BandwidthWindow(trace.at(0.0, offsets[c]) * 1000.0) for c in range(n)]
    policy = registry.make("adaptation", policy_name, seed) if policy_name == "jellyfish" else None
    fixed = None if policy else registry.make("adaptation", policy_name)
    start_rung = fixed.rung(Snapshot(ladder, (), ())) if fixed is not None else 0
    pooled = fixed is not None
    run = _Run(
        env, ladder, cfg, tuple(clients), policy_name, windows, [UplinkEstimator() for _ in range(n)],
        [start_rung] * n, [trace.at(0.0, o) * 1000.0 for o in offsets], [start_rung] * cfg.workers,
        [cfg.max_batch if pooled else 1] * cfg.workers,
    )  # fmt: skip
    queues = 1 if pooled else cfg.workers
    run.queues = [[] for _ in range(queues)]
    run.wakeups = [env.event() for _ in range(queues)]
    if policy is not None:
        env.process(_controller(run, policy))
    discipline: Callable[[int], QueueDiscipline] = (
        (lambda b: registry.make("queueing", "edf", max_batch=cfg.max_batch, max_queue=None))
        if pooled
        else (lambda b: registry.make("queueing", "batch-lazy-drop", max_batch=b, max_queue=None))
    )
    for w in range(cfg.workers):
        env.process(_worker(run, w, discipline))
    for c in range(n):
        env.process(_client(run, c, trace, offsets[c], phases[c]))
    env.run(until=cfg.duration_s + 2.0)  # answers of the last frames
    answered = len(run.accuracies)  # a frame still unanswered when the run ends counts as missed
    lat = run.latencies_ms
    return {
        "requests": run.frames,
        "miss_rate": round(1.0 - answered / run.frames, 6) if run.frames else 0.0,
        "dropped": run.dropped,
        "dropped_unmapped": run.unmapped,
        "late": run.late,
        "accuracy": round(statistics.mean(run.accuracies), 6) if run.accuracies else 0.0,
        "answered_in_time": answered,
        "answered_upscaled": run.upscaled,
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 2) if lat else None,
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 2) if lat else None,
    }


@dataclass(frozen=True)
class Sweep:
    client_counts: tuple[int, ...] = CLIENT_COUNTS
    fps: tuple[str, ...] = FPS
    slos: tuple[str, ...] = SLOS
    traces: tuple[str, ...] = TRACES
    policies: tuple[str, ...] = POLICIES
    seeds: int = 1


def run_sweep(
    sweep: Sweep, cfg: JellyfishSimConfig, on_row: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    ladder = efficientnet_ladder(cfg.max_batch, low_res_px=cfg.low_res_px)
    rows = []
    for trace_name in sweep.traces:
        trace = bundled_trace(trace_name)
        for count in sweep.client_counts:
            for fps in sweep.fps:
                for slo in sweep.slos:
                    clients = bundled_client_set(count, fps, slo)
                    for seed in range(sweep.seeds):
                        for policy in sweep.policies:
                            row = {"trace": trace_name, "clients": count, "fps": fps, "slo_ms": slo,
                                   "seed": seed, "policy": policy}  # fmt: skip
                            row.update(simulate_run(ladder, clients, trace, policy, seed, cfg))
                            rows.append(row)
                            if on_row is not None:
                                on_row(row)
    return rows


def summarize(rows: Sequence[dict[str, Any]], cfg: JellyfishSimConfig) -> dict[str, Any]:
    """Per trace and policy: miss rate over all frames, mean accuracy of in-time answers, drops."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["trace"], row["policy"]), []).append(row)
    out = []
    for (trace, policy), group in by.items():
        frames = sum(r["requests"] for r in group)
        answered = sum(r["answered_in_time"] for r in group)
        missed = frames - answered
        accuracy = sum(r["accuracy"] * r["answered_in_time"] for r in group) / answered if answered else 0.0
        out.append({"trace": trace, "policy": policy, "runs": len(group), "requests": frames,
                    "miss_rate": round(missed / frames, 6) if frames else 0.0,
                    "accuracy": round(accuracy, 6), "dropped": sum(r["dropped"] for r in group),
                    "dropped_unmapped": sum(r["dropped_unmapped"] for r in group),
                    "late": sum(r["late"] for r in group),
                    "answered_upscaled": sum(r["answered_upscaled"] for r in group)})  # fmt: skip
    return {"experiment": "jellyfish", "config": asdict(cfg), "by_trace_policy": out}


def write_outputs(rows: Sequence[dict[str, Any]], summary: dict[str, Any], out_dir: Path) -> dict[str, str]:
    names = list(rows[0]) if rows else ["trace"]
    return write_experiment(rows, names, summary, out_dir, "jellyfish.png", lambda path: _plot(summary, path))


def _plot(summary: dict[str, Any], path: Path) -> None:
    """Accuracy against miss rate per trace, one marker per policy (the paper's Fig. 7 layout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = summary["by_trace_policy"]
    traces = list(dict.fromkeys(e["trace"] for e in entries))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.4), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        for e in (e for e in entries if e["trace"] == trace):
            ax.scatter(100 * e["miss_rate"], 100 * e["accuracy"], label=e["policy"], s=40)
        ax.set_title(f"{trace} trace", fontsize=9)
        ax.set_xlabel("deadline miss rate (%)")
        ax.set_ylabel("accuracy of in-time answers (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
