"""``failsoft demo``: a failure and its recovery, live, on a real (embedded) cluster.

The demo serves :data:`EDGE_YAML` (``examples/edge.yaml``: 6 servers in 3 edge sites, 12 apps of
the two digits families, each server running one critical camera app and one OCR app) with the
FailLite policy, drives client load at every app, kills a server, and shows live which app moved
where, on which variant, and how long it took; then the server comes back and its apps return.
It ends with a summary table and a plot of the latency clients saw (PNG, see
:mod:`failsoft.runtime.demo_plot`), written with the raw data (``failsoft-demo.json``: every
request, every event) into an output folder: ``--out``, by default ``demo/`` in the state directory
(``~/.local/state/failsoft/demo``), never the current directory.

Capacities follow the machine: each server's memory is set so that its primaries fill ~70 % of it
with the memory the local profiles measured (FailLite's testbed runs near 50 % with 20 % headroom;
tighter here so that warm backups must be smaller variants). The zoo's digits families are built
first if missing (about a minute on two cores).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from failsoft.runtime.config import RuntimeConfig, config_from_dict, default_state_dir
from failsoft.runtime.gateway.metrics import first_recoveries
from failsoft.runtime.loadgen import LoadProcess, LoadSpec, Sample

EDGE_YAML = """\
# failsoft's demo cluster: 6 edge servers in 3 sites, 12 apps (FailLite 5.2-style, digits families).
# `failsoft serve examples/edge.yaml` serves it. Capacities are MB of the zoo's measured memory, with
# room for CPU and CUDA profiles alike: a server's two primaries take ~20 MB on CPU and ~86 MB with
# CUDA (each model carries ~33 MB of CUDA workspace), so 128 MB leaves a warm backup room on both.
# `failsoft demo` serves it with capacities scaled to this machine's profiles so that primaries fill
# 70 % of each server, and warm backups must often be smaller variants.
name: edge
servers:
  - {name: a1, site: edge-a, memory_mb: 128, compute: 2.0}
  - {name: a2, site: edge-a, memory_mb: 128, compute: 2.0}
  - {name: b1, site: edge-b, memory_mb: 128, compute: 2.0}
  - {name: b2, site: edge-b, memory_mb: 128, compute: 2.0}
  - {name: c1, site: edge-c, memory_mb: 128, compute: 2.0}
  - {name: c2, site: edge-c, memory_mb: 128, compute: 2.0}
apps:
  - {name: cam-1, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: a1, variant: cnn_l}}
  - {name: cam-2, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: a2, variant: cnn_l}}
  - {name: cam-3, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: b1, variant: cnn_l}}
  - {name: cam-4, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: b2, variant: cnn_l}}
  - {name: cam-5, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: c1, variant: cnn_l}}
  - {name: cam-6, family: digits_cnn, critical: true, rate_rps: 5, slo_ms: 50,
     primary: {server: c2, variant: cnn_l}}
  - {name: ocr-1, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: a1, variant: mlp_l}}
  - {name: ocr-2, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: a2, variant: mlp_l}}
  - {name: ocr-3, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: b1, variant: mlp_l}}
  - {name: ocr-4, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: b2, variant: mlp_l}}
  - {name: ocr-5, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: c1, variant: mlp_l}}
  - {name: ocr-6, family: digits_mlp, rate_rps: 5, slo_ms: 100,
     primary: {server: c2, variant: mlp_l}}
failover: {policy: faillite, alpha: 0.1, site_independent: true, warm_replicas: 1}
heartbeat: {interval_ms: 20, missed: 2}
gateway: {host: 127.0.0.1, port: 8000}
"""

DEMO_FAMILIES = ("digits_mlp", "digits_cnn")
RESTORE_WAIT_S = 60.0
TARGET_UTILIZATION = 0.7


def default_out_dir() -> Path:
    """Where the demo writes its plot and data unless told: ``demo/`` in the state directory."""
    return default_state_dir() / "demo"


@dataclass
class DemoSettings:
    out_dir: Path = field(default_factory=default_out_dir)
    kill: str = "a1"
    warmup_s: float = 4.0
    down_s: float = 8.0
    after_s: float = 5.0
    period_s: float = 0.2
    watched_period_s: float = 0.04  # the apps on the server to be killed
    repository: Path | None = None


def demo_config(repository: Path, state_dir: Path) -> RuntimeConfig:
    """EDGE_YAML on a free port, with server memory scaled to this machine's measured profiles."""
    from failsoft.zoo import ModelRepository

    data = yaml.safe_load(EDGE_YAML)
    families = {f.name: f for f in ModelRepository(repository).families(list(DEMO_FAMILIES))}
    load: dict[str, float] = {s["name"]: 0.0 for s in data["servers"]}
    for app in data["apps"]:
        load[app["primary"]["server"]] += families[app["family"]].variant(app["primary"]["variant"]).memory_mb
    for server in data["servers"]:
        server["memory_mb"] = math.ceil(load[server["name"]] / TARGET_UTILIZATION * 10) / 10
    data.update(
        repository=str(repository), state_dir=str(state_dir), gateway={"host": "127.0.0.1", "port": 0}
    )
    data["agents"] = {"restart": False}
    return config_from_dict(data, source="failsoft demo (examples/edge.yaml)")


def ensure_zoo(repository: Path, say: Any) -> None:
    from failsoft.zoo import ModelRepository, build_zoo

    repo = ModelRepository(repository)
    missing = [f for f in DEMO_FAMILIES if f not in repo.family_names()]
    if missing:
        say(f"building the digits families into {repository} (once, about a minute) ...")
        build_zoo(repository, families=missing)


@contextmanager
def running(config: RuntimeConfig) -> Iterator[Any]:
    from failsoft.runtime.session import Session

    session = Session(config)
    session.start()
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class DemoRun:
    """What one demo run saw: every client request, the controller's events, the moments, the summary."""

    samples: list[Sample]
    events: list[dict[str, Any]]
    marks: dict[str, float]
    summary: dict[str, Any]


def run_demo(settings: DemoSettings, view: Any) -> dict[str, Any]:
    """The whole demo; ``view`` shows progress (see :mod:`failsoft.cli.demo`). Returns the summary,
    with the paths of the plot and of the data it was drawn from."""
    from failsoft.zoo import resolve_repository

    repository = resolve_repository(settings.repository)
    ensure_zoo(repository, view.say)
    state_dir = Path(tempfile.mkdtemp(prefix="failsoft-demo-"))  # a throwaway store
    try:
        run = _run(settings, view, demo_config(repository, state_dir))
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return {**run.summary, **write_outputs(run, settings.out_dir)}


def write_outputs(run: DemoRun, out_dir: Path) -> dict[str, str]:
    """The latency plot, and everything it and the summary were made from as one JSON document."""
    from failsoft.runtime.demo_plot import draw, layout

    affected = [row["app"] for row in run.summary["apps"]]
    killed = run.summary["killed"]
    title = f"failsoft demo: client latency through a crash of {killed} (FailLite failover)"
    plot = draw(
        layout(run.samples, run.events, run.marks, killed, affected), out_dir / "failsoft-demo.png", title
    )
    doc = {
        "marks": run.marks,
        "summary": run.summary,
        "events": run.events,
        "samples": [s.to_dict() for s in run.samples],
    }
    data = out_dir / "failsoft-demo.json"
    data.write_text(json.dumps(doc, indent=1) + "\n")
    return {"plot": str(plot), "data": str(data)}


def _run(settings: DemoSettings, view: Any, config: RuntimeConfig) -> DemoRun:
    """Serve, load, kill, revive: the client samples, the events, the moments, the summary."""

    view.say(
        f"starting {len(config.servers)} servers in {len(config.sites)} sites, {len(config.apps)} apps ..."
    )
    with running(config) as session:
        client = session.client(timeout=10.0)
        shapes = {
            a.name: session.prepared.models[a.family].input_shape for a in session.prepared.deployment.apps
        }
        total = settings.warmup_s + settings.down_s + settings.after_s + RESTORE_WAIT_S + 10.0
        load = LoadProcess(_load_spec(settings, session, shapes, total)).start()
        marks: dict[str, float] = {"start": time.time()}
        view.watch(client, load, marks, settings.warmup_s, "serving")
        marks["kill"] = client.admin("kill", server=settings.kill)["killed"][0]["at"]
        view.watch(client, load, marks, settings.down_s, f"{settings.kill} killed")
        marks["revive"] = time.time()  # the restart request; the plot marks the server_up event
        session.revive(settings.kill)
        view.watch(
            client, load, marks, settings.after_s, f"{settings.kill} restarting", until=_restored(client)
        )
        samples = load.stop()
        report = client.recoveries()
        status = client.status()
        client.close()
    return DemoRun(samples, report["events"], marks, summarize(samples, report, status, marks, settings.kill))


def _load_spec(settings: DemoSettings, session: Any, shapes: dict[str, Any], total_s: float) -> LoadSpec:
    """Every app asked every ``period_s``, each at its own phase (``stagger``: requests do not queue
    behind each other in bursts); the apps of the server to be killed more often, so the zoomed plot
    shows their outage request by request."""
    watched = [a.name for a in session.prepared.deployment.apps if a.primary.server == settings.kill]
    return LoadSpec(
        session.url,
        shapes,
        settings.period_s,
        5.0,
        total_s,
        max_in_flight=2,
        periods=dict.fromkeys(watched, settings.watched_period_s),
        stagger=True,
    )


def _restored(client: Any) -> Any:
    """A check for the watch loop: every app back on its primary."""

    def check() -> bool:
        return all(a["route"] == a["primary"] for a in client.status()["apps"])

    return check


def summarize(
    samples: list[Sample],
    report: dict[str, Any],
    status: dict[str, Any],
    marks: dict[str, float],
    killed: str,
) -> dict[str, Any]:
    kill_at = marks["kill"]
    events = [e for e in report["events"] if e["timestamp"] >= kill_at - 0.5]
    detected = next(
        (e["detected_at"] for e in events if e["type"] == "failure" and e.get("server") == killed), None
    )
    affected = sorted(
        {e["app"] for e in events if e["type"] == "failure" and e.get("server") == killed and e["app"]}
    )
    recoveries = first_recoveries(report["recoveries"], kill_at - 0.5)
    rows = [_row(app, samples, events, recoveries.get(app, {}), kill_at, killed) for app in affected]
    scored = [s for s in samples if s.ok and s.correct is not None]
    return {
        "killed": killed,
        "detection_ms": None if detected is None else (detected - kill_at) * 1000.0,
        "apps": rows,
        "requests": len(samples),
        "failed": sum(1 for s in samples if not s.ok),
        "accuracy_of_answers": sum(bool(s.correct) for s in scored) / len(scored) if scored else None,
        "degraded_answers": sum(1 for s in samples if s.ok and s.degraded),
        "servers_up_at_end": [s["name"] for s in status["servers"] if s["state"] == "up"],
        "unexpected_failures": unexpected_failures(report["events"], marks, killed),
    }


def unexpected_failures(
    events: list[dict[str, Any]], marks: dict[str, float], killed: str
) -> list[dict[str, Any]]:
    """Servers declared down that nobody killed (or before the kill): a false failure, each with
    when it was detected (seconds after the demo's start)."""
    kill_at, start = marks["kill"], marks["start"]
    seen = {
        (e["server"], round(e["detected_at"] - start, 3))
        for e in events
        if e["type"] == "failure" and not (e.get("server") == killed and e["detected_at"] >= kill_at)
    }
    return [{"server": server, "detected_after_start_s": at} for server, at in sorted(seen)]


def _row(
    app: str,
    samples: list[Sample],
    events: list[dict[str, Any]],
    rec: dict[str, Any],
    kill_at: float,
    killed: str,
) -> dict[str, Any]:
    """How one app on the killed server fared: where it went, on what, how fast."""
    mine = [s for s in samples if s.app == app]
    failover = next((e for e in events if e["type"] == "failover" and e["app"] == app), {})
    upgrade = next((e for e in events if e["type"] == "upgrade" and e["app"] == app), {})
    first_ok = min((s.done for s in mine if s.ok and s.server != killed and s.done > kill_at), default=None)
    return {
        "app": app,
        "kind": failover.get("kind"),
        "moved_to": f"{failover.get('server')}/{failover.get('variant')}" if failover else None,
        "upgraded_to": upgrade.get("variant"),
        # FailLite's MTTR (5.1): detection to the new route published, loading included
        "mttr_ms": failover.get("route_ms"),
        # detection to the first answer on the new route, as the gateway saw it
        "first_answer_ms": rec.get("first_answer_ms"),
        # the kill to the first answer a client got
        "client_outage_ms": None if first_ok is None else (first_ok - kill_at) * 1000.0,
        "failed_requests": sum(1 for s in mine if not s.ok),
        "restored": any(e["type"] == "restore" and e["app"] == app for e in events),
    }
