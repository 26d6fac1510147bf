"""``failsoft bench adaptation CONFIG --trace wifi|lte|synthetic``: Jellyfish against the EDF baselines
on a real cluster, clients replaying a bandwidth trace.

The config must have one ``slo`` service (e.g. ``examples/slo.yaml``). For each policy, one cluster is
started from the config with the service's ``params.policy`` set to it and its agents' queue
discipline set as the paper runs it: ``batch-lazy-drop`` for ``jellyfish`` (per-worker batches, lazy
drop), ``edf`` for ``edf-small|medium|large`` (Clockwork-style: one fixed variant on every worker,
earliest deadline first; the gateway sends each frame to the worker with the fewest in flight, which
stands in for one shared queue).

The clients are one of the paper's client sets (``--clients``, ``--fps``, ``--slo``: SLO and frame
rate per client), each a :class:`~failsoft.slo_client.SloStream` replaying the trace from its own
offset (seeded, the same for every policy) through a :class:`~failsoft.slo_client.TraceUplink`: it
measures its bandwidth from its answers, reports it, and sends the frame size the server asks for. The
frames are held-out digits with labels (the zoo's test split).

Per policy: ``requests`` (frames sent), ``miss_rate`` (frames dropped, failed or answered after their
SLO, over all frames), ``dropped``, ``late``, ``failed``, ``accuracy`` (mean accuracy of the variants
that answered in time, from their profiles, as the paper counts it), ``top1`` (the same answers
checked against their labels), ``latency_ms.{p50,p99}`` (end to end, capture to answer, of the
answers that were not dropped) and ``variants`` (answers per variant). The targets: Jellyfish's miss
rate <= 1% (synthetic, WiFi) or 1.5% (LTE), below every EDF baseline, at an accuracy no lower than
``edf-small``'s.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.adaptation_data import TRACE_STEP_S, bundled_client_set, bundled_trace
from failsoft.bench.cluster import read_bench_config, with_service_params
from failsoft.bench.models import ensure_config_models
from failsoft.errors import ConfigError
from failsoft.slo_client import FrameResult

POLICIES = ("jellyfish", "edf-small", "edf-medium", "edf-large")
DISCIPLINE = {"jellyfish": "batch-lazy-drop"}  # the baselines: "edf"
TARGET_MISS = {"synthetic": 0.01, "wifi": 0.01, "lte": 0.015}
Progress = Callable[[str], None]


@dataclass(frozen=True)
class AdaptationBenchSettings:
    trace: str = "wifi"
    policies: tuple[str, ...] = POLICIES
    clients: int = 4  # the paper's client sets: 1, 2, 4 or 8 clients
    fps: str = "15"  # "15", "25" or "var"
    slo: str = "100"  # "75", "100", "150" or "var"
    duration_s: float = 30.0  # load per policy, after the warm-up
    warmup_s: float = 5.0
    rtt_ms: float = 1.0
    seed: int = 0
    root: str | None = None  # model repository (default: the config's)

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ConfigError(f"unknown adaptation policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
        if self.trace not in TRACE_STEP_S:
            raise ConfigError(f"unknown trace {self.trace!r} (known: {', '.join(TRACE_STEP_S)})")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ConfigError(
                f"duration_s must be > 0 and warmup_s >= 0; got {self.duration_s}, {self.warmup_s}"
            )
        bundled_client_set(self.clients, self.fps, self.slo)  # names the set when it does not exist


def run(
    config_path: str | Path, settings: AdaptationBenchSettings, progress: Progress | None = None
) -> dict[str, Any]:
    say = progress or (lambda _: None)
    path = Path(config_path)
    data, service = _bench_config(path, settings)
    ensure_config_models(path, data, say)
    clients = bundled_client_set(settings.clients, settings.fps, settings.slo)
    trace = bundled_trace(settings.trace)
    rng = np.random.default_rng(settings.seed)
    offsets = [float(rng.uniform(0, len(trace.mbps) * trace.step_s)) for _ in clients]
    result: dict[str, Any] = {
        "config": str(path),
        "settings": asdict(settings),
        "service": service,
        "clients": [
            {"slo_ms": s, "fps": f, "trace_offset_s": round(o, 3)}
            for (s, f), o in zip(clients, offsets, strict=True)
        ],
        "trace": {
            "name": trace.name,
            "step_s": trace.step_s,
            "mbps_min": min(trace.mbps),
            "mbps_max": max(trace.mbps),
        },
        "load": (
            "held-out digits (the zoo's test split) with their labels; frame sizes declared, "
            "their transfer shaped by the trace"
        ),
    }
    policies: dict[str, Any] = {}
    for policy in settings.policies:
        say(f"policy {policy}: starting the cluster")
        policies[policy] = _run_policy(path, data, service, policy, clients, offsets, settings, say)
    result["policies"] = policies
    result["targets"] = _targets_met(result, settings.trace)
    return result


def _bench_config(path: Path, settings: AdaptationBenchSettings) -> tuple[dict[str, Any], str]:
    data = read_bench_config(path, settings.root)
    slo = [s for s in data.get("services") or [] if s.get("mode") == "slo"]
    if len(slo) != 1:
        raise ConfigError(f"{str(path)!r}: bench adaptation needs exactly one slo service; found {len(slo)}")
    return data, str(slo[0]["name"])


def _policy_config(data: dict[str, Any], service: str, policy: str) -> dict[str, Any]:
    data = with_service_params(data, service, policy=policy)
    agents = data.get("agents") or {}
    queue = {**(agents.get("queue") or {}), "discipline": DISCIPLINE.get(policy, "edf")}
    data["agents"] = {**agents, "queue": queue}
    return data


def _run_policy(
    path: Path,
    data: dict[str, Any],
    service: str,
    policy: str,
    clients: Sequence[tuple[float, float]],
    offsets: Sequence[float],
    settings: AdaptationBenchSettings,
    say: Progress,
) -> dict[str, Any]:
    from failsoft.bench.cluster import wait_home
    from failsoft.runtime.config import config_from_dict
    from failsoft.runtime.session import Session

    with tempfile.TemporaryDirectory(prefix="failsoft-bench-adaptation-") as state:
        cfg = _policy_config(data, service, policy)
        cfg["state_dir"] = state
        config = config_from_dict(cfg, source=str(path), base_dir=path.parent)
        with Session(config, num_cpus=2) as session:
            assert session.prepared is not None
            client = session.client(timeout=20.0)
            try:
                wait_home(client)
                seconds = settings.warmup_s + settings.duration_s
                say(f"policy {policy}: {len(clients)} clients for {seconds:.0f} s")
                frames = asyncio.run(_drive(session.url, service, clients, offsets, settings))
                entry = next(e for e in client.repository_index() if e["name"] == service)
            finally:
                client.close()
    seen = {k: entry.get(k) for k in ("policy", "replans", "switches", "overhead_ms", "workers")}
    return {**_summary(frames), "discipline": DISCIPLINE.get(policy, "edf"), "service_at_end": seen}


async def _drive(
    url: str,
    service: str,
    clients: Sequence[tuple[float, float]],
    offsets: Sequence[float],
    settings: AdaptationBenchSettings,
) -> list[tuple[FrameResult, bool | None]]:
    """Every client sends its frames at its rate through its shaped uplink; frames after the warm-up
    are kept, with whether the answer matched its label."""
    import httpx

    from failsoft.adaptation_data import bundled_trace
    from failsoft.slo_client import SloStream, TraceUplink
    from failsoft.zoo.digits import load_digits_split

    split = load_digits_split()
    inputs, labels = np.asarray(split.x_test, dtype=np.float32), np.asarray(split.y_test)
    trace = bundled_trace(settings.trace)
    kept: list[tuple[FrameResult, bool | None]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:
        streams = [
            SloStream(http, service, slo, fps, uplink=TraceUplink(trace, offset, settings.rtt_ms))
            for (slo, fps), offset in zip(clients, offsets, strict=True)
        ]
        for stream in streams:
            await stream.register()
        started = time.monotonic()
        measure_from = started + settings.warmup_s
        ends = measure_from + settings.duration_s

        async def one(stream: SloStream, i: int) -> None:
            result = await stream.send(inputs[i : i + 1])
            if result.captured_s < measure_from:
                return
            correct = None
            if result.outputs is not None:
                correct = bool(int(np.argmax(result.outputs)) == int(labels[i]))
            kept.append((result, correct))

        async def client_loop(n: int, stream: SloStream) -> None:
            tasks: set[asyncio.Task[None]] = set()
            period = 1.0 / stream.fps
            next_at = started + period * (n / max(len(streams), 1))  # phases spread over one frame
            i = n * 97
            while next_at < ends:
                await asyncio.sleep(max(next_at - time.monotonic(), 0.0))
                task = asyncio.ensure_future(one(stream, i % len(inputs)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                next_at += period
            if tasks:
                await asyncio.gather(*tasks)

        await asyncio.gather(*(client_loop(n, s) for n, s in enumerate(streams)))
    return kept


def _summary(frames: Sequence[tuple[FrameResult, bool | None]]) -> dict[str, Any]:
    results = [r for r, _ in frames]
    n = len(results)
    on_time = [(r, c) for r, c in frames if not r.missed]
    answered = [r.e2e_ms for r in results if r.error is None and not r.dropped]
    accuracies = [r.accuracy for r, _ in on_time if r.accuracy is not None]
    checked = [c for _, c in on_time if c is not None]
    failed = [r for r in results if r.error is not None]
    return {
        "requests": n,
        "miss_rate": round(sum(r.missed for r in results) / n, 6) if n else None,
        "dropped": sum(r.dropped for r in results),
        "drop_reasons": dict(Counter(r.drop_reason or "?" for r in results if r.dropped)),
        "late": sum(r.error is None and not r.dropped and r.missed for r in results),
        "failed": len(failed),
        "errors": sorted(Counter(r.error for r in failed).items(), key=lambda kv: -kv[1])[:3],
        "accuracy": round(statistics.mean(accuracies), 6) if accuracies else None,
        "top1": round(sum(checked) / len(checked), 6) if checked else None,
        "latency_ms": {
            "p50": round(float(np.percentile(answered, 50)), 2) if answered else None,
            "p99": round(float(np.percentile(answered, 99)), 2) if answered else None,
        },
        "upload_ms_p50": round(float(np.median([r.upload_ms for r in results])), 2) if results else None,
        "variants": dict(Counter(r.variant for r, _ in on_time if r.variant)),
        "frame_px": dict(Counter(str(r.frame_px) for r in results)),
    }


def _targets_met(result: dict[str, Any], trace: str) -> dict[str, Any]:
    policies = result["policies"]
    jelly = policies.get("jellyfish")
    if not jelly or jelly["miss_rate"] is None:
        return {}
    baselines = {p: v for p, v in policies.items() if p != "jellyfish" and v["miss_rate"] is not None}
    small = baselines.get("edf-small")
    return {
        "miss_rate_target": TARGET_MISS[trace],
        "miss_rate_met": jelly["miss_rate"] <= TARGET_MISS[trace],
        "below_every_baseline": all(jelly["miss_rate"] < v["miss_rate"] for v in baselines.values())
        if baselines
        else None,
        "accuracy_at_least_edf_small": (jelly["accuracy"] or 0) >= (small["accuracy"] or 0)
        if small
        else None,
    }
