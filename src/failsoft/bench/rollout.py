"""``failsoft bench rollout CONFIG``: a rolling update of every app to a new version, under load.

The config is served from a repository that mirrors the config's (its files linked, not copied)
with a version 2 of every variant its apps run (``<family>/<variant>/2/``, the same files: the
benchmark measures the update, not a different model). Every app is driven at a steady rate by a
client process of its own; after a warm-up, each app in turn is rolled out to version 2 through
Triton's repository API (``POST /v2/repository/models/{app}/load``), one deploy after the other,
each waited for. Then, per app:

* ``failed``: requests that got no answer (the target: none);
* ``usual_p99_ms``: its latency's p99 before the rollout began, and ``gap_ms``: the largest time
  between two consecutive answers from the rollout's start to its end (any answer: a request sent
  every ``period_s`` makes that the steady gap); ``gap_excess_ms`` is ``gap_ms - period_s``, which
  the target holds to at most ``usual_p99_ms + 50``;
* ``old_after_switch``: answers to requests sent after its ``rollout`` event (the route switched)
  that still came from the old version (the target: none), counted from 50 ms after the event
  (``old_after_switch_strict``: from the event itself; the gateway mirrors the route a round trip
  later).
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.bench.models import ensure_models
from failsoft.runtime.config import RuntimeConfig, load_config
from failsoft.runtime.loadgen import LoadProcess, LoadSpec, Sample

Progress = Callable[[str], None]
MIRROR_GRACE_S = 0.05
GAP_TARGET_MS = 50.0


def run(
    config_path: str | Path, period_s: float = 0.05, warmup_s: float = 3.0, progress: Progress | None = None
) -> dict[str, Any]:
    from failsoft.runtime.session import Session

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    base = load_config(config_path)
    ensure_models(base, say)
    root = Path(tempfile.mkdtemp(prefix="failsoft-rollout-"))
    try:
        cfg = _config(base, root)
        say(f"serving {config_path} from {cfg.repository} (version 2 of every variant its apps run) ...")
        with Session(cfg) as session:
            client = session.client(timeout=60.0)
            _wait_home(client, 120.0)
            deployment, models = session.prepare().deployment, session.prepare().models
            apps = [a.name for a in deployment.apps]
            shapes = {a.name: models[a.family].input_shape for a in deployment.apps}
            spec = LoadSpec(session.url, shapes, period_s, 5.0, 3600.0, max_in_flight=4, stagger=True)
            traffic = LoadProcess(spec).start()
            try:
                _wait_answering(traffic, apps, 120.0)  # the client process started and every app answers
                time.sleep(warmup_s)
                t_start = time.time()
                for app in apps:
                    answer = client.load_model(app, 2)
                    say(f"rolling {app} out to version 2 (config version {answer['version']}) ...")
                    _wait_done(client, int(answer["version"]), 120.0)
                t_end = time.time()
                time.sleep(1.0)
            finally:
                samples = traffic.stop()
            events = client.recoveries()["events"]
            homes = {a["name"]: a["primary"]["variant"] for a in client.status()["apps"]}
            client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return measure(apps, samples, events, homes, t_start, t_end, period_s) | {
        "config": str(config_path),
        "period_s": period_s,
        "warmup_s": warmup_s,
    }


def _config(base: RuntimeConfig, root: Path) -> RuntimeConfig:
    """``base`` served from a mirror of its repository with a version 2 of each variant it runs."""
    mirror = root / "zoo"
    for family in {a.family for a in base.apps}:
        source = base.repository / family
        for variant in source.iterdir():
            if variant.is_dir():
                _link_files(variant, mirror / family / variant.name)
                _link_files(variant, mirror / family / variant.name / "2")
    return base.replace(
        repository=mirror, state_dir=root / "state", store_url="sqlite", admin_token=None
    ).with_gateway(port=0)


def _link_files(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file():
            (target / item.name).symlink_to(item.resolve())
        elif item.is_dir() and not item.name.isdigit():
            (target / item.name).symlink_to(item.resolve(), target_is_directory=True)


def _wait_home(client: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.status()
        if status["idle"] and all(a["route"] == a["primary"] for a in status["apps"]):
            return
        time.sleep(0.2)


def _wait_answering(traffic: LoadProcess, apps: Sequence[str], timeout_s: float, answers: int = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = Counter(s.app for s in list(traffic.samples) if s.ok)
        if all(done[app] >= answers for app in apps):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the clients got no {answers} answers from every app within {timeout_s:g} s")


def _wait_done(client: Any, version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.deploy_status()
        if status["version"] == version and (status.get("last") or {}).get("state") == "done":
            return
        time.sleep(0.05)
    raise TimeoutError(f"config version {version} not deployed within {timeout_s:g} s")


def measure(
    apps: Sequence[str],
    samples: Sequence[Sample],
    events: Sequence[dict[str, Any]],
    homes: dict[str, str],
    t_start: float,
    t_end: float,
    period_s: float,
) -> dict[str, Any]:
    """Per app and in all: failures, the largest answer gap against the usual p99, old answers."""
    per_app: dict[str, Any] = {}
    for app in apps:
        mine = [s for s in samples if s.app == app]
        before = [s.latency_ms for s in mine if s.ok and s.sent < t_start]
        p99 = float(np.percentile(before, 99)) if before else None
        done = [t_start, *sorted(s.done for s in mine if s.ok and t_start <= s.done <= t_end), t_end]
        gap_ms = max(b - a for a, b in itertools.pairwise(done)) * 1000.0
        switch = next(
            (e["timestamp"] for e in events if e["type"] == "rollout" and e.get("app") == app), None
        )
        new = homes.get(app)
        after = [s for s in mine if s.ok and switch is not None and s.sent >= switch]
        per_app[app] = {
            "requests": len(mine),
            "failed": sum(not s.ok for s in mine),
            "errors": dict(Counter(str(s.error)[:120] for s in mine if not s.ok)),
            "usual_p99_ms": None if p99 is None else round(p99, 2),
            "gap_ms": round(gap_ms, 2),
            "gap_excess_ms": round(gap_ms - period_s * 1000.0, 2),
            "new_version": new,
            "rolled_out": switch is not None,
            "old_after_switch": sum(
                s.variant != new for s in after if switch is not None and s.sent >= switch + MIRROR_GRACE_S
            ),
            "old_after_switch_strict": sum(s.variant != new for s in after),
        }
    rows = per_app.values()
    return {
        "apps": per_app,
        "requests": sum(r["requests"] for r in rows),
        "failed": sum(r["failed"] for r in rows),
        "rollout_s": round(t_end - t_start, 3),
        "targets": {
            "failed==0": all(r["failed"] == 0 for r in rows),
            "gap_excess<=p99+50ms": all(
                r["usual_p99_ms"] is not None and r["gap_excess_ms"] <= r["usual_p99_ms"] + GAP_TARGET_MS
                for r in rows
            ),
            "all_rolled_out": all(r["rolled_out"] for r in rows),
            "new_version_after_switch": all(r["old_after_switch"] == 0 for r in rows),
        },
    }
