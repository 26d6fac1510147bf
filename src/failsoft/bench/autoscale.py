"""``failsoft bench autoscale CONFIG``: an autoscaled app under a load ramp, on a real cluster.

The config's first app with ``autoscaling`` (or ``--app``) is served on an embedded cluster and
loaded by a closed-loop client whose concurrency steps up (``levels``, e.g. 1, 2, 4, 8 requests in
flight), holds each step, then drops back to one and finally to none. Every 250 ms the app's
serving replicas are read from the controller's status. The JSON says:

* ``replicas``: the replicas serving over time (``t`` seconds since the ramp started), and the
  ``scale`` events the controller sent;
* ``unloaded_p99_ms`` (one request in flight, min replicas) and, per step, its p99 and the
  replicas at its end; ``p99_vs_unloaded`` at the top step, measured from ``settle_s`` after it
  started (the issue's goal: under 2x once scaled out);
* ``failed``: requests that got no answer (the goal: 0), and ``scaled_back``: whether the app was
  back at its min replicas within ``tail_s`` after the load ended.

``--slow-ms`` adds that much latency to every inference on every server (``failsoft chaos slow``):
on a small machine, where the models answer in a millisecond, it stands for a model whose requests
take that long, so that the concurrency, not the host's CPUs, decides the replicas needed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.bench.cluster import private_state
from failsoft.errors import ConfigError
from failsoft.runtime.config import RuntimeConfig, load_config
from failsoft.runtime.loadgen import LoadSpec, LoadThread, Sample

Progress = Callable[[str], None]
STATUS_S = 0.25
START_S = 60.0  # how long a step's load may take to start answering


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    app: str | None = None
    levels: tuple[int, ...] = (1, 2, 4, 8)  # requests in flight, step by step
    step_s: float = 8.0
    settle_s: float = 4.0  # the top step's p99 counts from this long after it started
    tail_s: float = 20.0  # how long the app may take to scale back in after the load
    slow_ms: float = 0.0


def run(
    config_path: str | Path, settings: AutoscaleSettings, progress: Progress | None = None
) -> dict[str, Any]:
    from failsoft.bench.models import ensure_families

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    base = load_config(config_path)
    app = _app(base, settings.app)
    ensure_families(base, say)
    with private_state(base, "failsoft-bench-autoscale-state-") as cfg:
        return _run(cfg, app, settings, say)


def _app(config: RuntimeConfig, name: str | None) -> str:
    scaled = [a.name for a in config.apps if a.autoscaling is not None]
    if name is not None:
        if name not in scaled:
            raise ConfigError(f"app {name!r} has no autoscaling in {config.source} (autoscaled: {scaled})")
        return name
    if not scaled:
        raise ConfigError(f"no app of {config.source} has autoscaling: nothing to bench")
    return scaled[0]


def _run(cfg: RuntimeConfig, app: str, settings: AutoscaleSettings, say: Progress) -> dict[str, Any]:
    from failsoft.bench.cluster import wait_home
    from failsoft.runtime.session import Session

    scaling = next(a.autoscaling for a in cfg.apps if a.name == app)
    assert scaling is not None
    say(f"[autoscale] deploying {cfg.source} ...")
    with Session(cfg) as session:
        client = session.client(timeout=30.0)
        wait_home(client, 300.0)
        for server in cfg.servers:
            client.admin("slow", server=server.name, ms=settings.slow_ms)
        size = int(client.model(app)["inputs"][0]["shape"][-1])
        watch = _Watch(client, app)
        watch.start()
        steps, samples = [], []
        t0 = time.time()
        for level in (*settings.levels, settings.levels[0]):
            say(f"[autoscale] {level} requests in flight for {settings.step_s:g} s")
            start = time.time()
            spec = LoadSpec(session.url, {app: (size,)}, 0.001, 10.0, settings.step_s + START_S,
                            max_in_flight=level, seed=level)  # fmt: skip
            traffic = LoadThread(spec).start()
            _until_flowing(traffic)  # the step counts from its first answer
            time.sleep(settings.step_s)
            got = traffic.stop(30.0)
            samples += got
            steps.append(
                _step(
                    level,
                    start - t0,
                    got,
                    watch.serving(),
                    settings.settle_s if level == max(settings.levels) else 0.0,
                )
            )
        ended = time.time()
        back = _wait_back(watch, scaling.min_replicas, settings.tail_s)
        watch.stop()
        events = [e for e in client.recoveries()["events"] if e["type"] == "scale" and e["app"] == app]
        client.close()
    unloaded = steps[0]["p99_ms"]
    top = next(s for s in steps if s["in_flight"] == max(settings.levels))
    return {
        "app": app,
        "autoscaling": asdict(scaling),
        "settings": asdict(settings),
        "unloaded_p99_ms": unloaded,
        "steps": steps,
        "p99_vs_unloaded": None
        if not unloaded or top["p99_ms"] is None
        else round(top["p99_ms"] / unloaded, 3),
        "failed": sum(1 for s in samples if not s.ok),
        "requests": len(samples),
        "scaled_back": back is not None,
        "scaled_back_s": None if back is None else round(back - ended, 3),
        "replicas": [{"t": round(t - t0, 3), "serving": n} for t, n in watch.timeline],
        "scale_events": [
            {
                "t": round(e["timestamp"] - t0, 3),
                "previous": e["previous"],
                "replicas": e["replicas"],
                "ongoing": e.get("ongoing"),
            }
            for e in events
            if e["timestamp"] >= t0
        ],
    }


def _step(level: int, at: float, samples: list[Sample], serving: int, settle_s: float) -> dict[str, Any]:
    start = min((s.sent for s in samples), default=0.0)
    ok = [s.latency_ms for s in samples if s.ok and s.sent >= start + settle_s]
    return {
        "in_flight": level,
        "at_s": round(at, 3),
        "requests": len(samples),
        "failed": sum(1 for s in samples if not s.ok),
        "p99_ms": round(float(np.percentile(ok, 99)), 3) if ok else None,
        "replicas_at_end": serving,
        "by_server": dict(sorted(Counter(s.server or "-" for s in samples).items())),
    }


def _until_flowing(traffic: LoadThread) -> None:
    """Wait (at most :data:`START_S`) for the load thread's first answer: its start (an event loop,
    a client, the digits inputs) takes seconds on a busy machine."""
    deadline = time.monotonic() + START_S
    while not traffic.samples and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_back(watch: _Watch, replicas: int, timeout_s: float) -> float | None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if watch.serving() == replicas:
            return time.time()
        time.sleep(STATUS_S)
    return None


class _Watch:
    """The app's serving replicas, read from the controller's status every :data:`STATUS_S`."""

    def __init__(self, client: Any, app: str) -> None:
        self.client, self.app = client, app
        self.timeline: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def serving(self) -> int:
        return self.timeline[-1][1] if self.timeline else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = self.client.status()
                entry = next(a for a in status["apps"] if a["name"] == self.app)
                self.timeline.append((time.time(), len(entry["replicas"]["serving"])))
            except Exception:  # a status read that fails is a gap in the timeline, not the bench's end
                pass
            self._stop.wait(STATUS_S)
