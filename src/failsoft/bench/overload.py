"""``failsoft bench overload CONFIG``: one server driven past what it can answer, measured.

Overload is not failure: a server whose queue is full while its heartbeats arrive and it answers
what it can must be kept serving, shedding the rest at once (503 with ``Retry-After``), never
reported unhealthy or failed over. This benchmark checks that, and what it costs in throughput:

1. one app of the config (the first by default) is served from a fresh cluster, on its primary;
2. ``base``: ``base_clients`` closed-loop clients (8) for ``base_s``, the throughput the server
   gives when it is busy but not overloaded;
3. ``overload``: ``clients`` closed-loop clients (32) for ``duration_s`` (60 s). Every request
   carries the same deadline (``deadline_s``, 2 s). Clients ask again at once after a refusal, the
   harder case for the server; ``backoff`` makes them wait out its ``Retry-After`` instead;
4. ``base_after``: the base again. The goodput ratio is the overload's answers per second over the
   mean of the two bases: on a shared machine whose other load drifts, bracketing keeps the drift
   out of the ratio.

Both phases use the serving benchmark's client and levels (:func:`failsoft.bench.serving.measure`,
:mod:`failsoft.bench.serving_load`). Per phase: ``goodput_rps`` (200s per second that came back in
the measured time), p50/p99 of the answered, the answers that were not 200 by status (how many
carried ``Retry-After``, how long they took: a refusal must come at once, not at the deadline),
goodput per ``window_s`` window, the server's serving-queue counters over the phase (served,
refused, dropped, expired; mean batch rows) and the controller's events over it by type. The
verdict (``checks``) is the issue's target:

* ``goodput``: ``goodput_rps`` at ``clients`` at least ``target_ratio`` (0.9) of that at
  ``base_clients`` (``goodput_ratio``);
* ``no_failure_events``: no ``unhealthy`` ("heartbeats but does not serve"), ``failure`` or
  ``failover`` event in either phase, and the app still on its server at the end;
* ``answered_or_refused``: every answer a 200, or a 429/503 that carried ``Retry-After`` and came
  within ``refusal_limit_s`` (a quarter of the deadline by default); no 504 (deadline exceeded).

``slow_ms`` injects a per-batch delay (``failsoft chaos slow``) so that a small model overloads too
(the tests use it). The figures are ratios within one run: compare nothing across machines.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError

Progress = Callable[[str], None]
FAILURE_EVENTS = ("unhealthy", "failure", "failover")
REFUSALS = ("429", "503")
QUEUE_COUNTERS = ("served", "refused", "dropped", "expired", "cancelled", "failed", "batches", "rows")


@dataclass(frozen=True)
class OverloadSettings:
    app: str | None = None  # the config's app to serve (default: the first)
    base_clients: int = 8
    clients: int = 32
    base_s: float = 20.0  # seconds measured at base_clients, after the warm-up
    duration_s: float = 60.0  # seconds measured at clients, after the warm-up
    warmup_s: float = 3.0  # seconds of load before each phase counts
    deadline_s: float = 2.0  # every request's deadline (parameters.timeout)
    encoding: str = "binary"  # KServe v2 binary tensors, or json
    backoff: bool = False  # clients wait out a refusal's Retry-After (else they ask again at once)
    slow_ms: float = 0.0  # injected delay per batch on the app's server (chaos slow)
    window_s: float = 10.0  # goodput is also counted per window of this length
    target_ratio: float = 0.9
    refusal_limit_s: float | None = None  # a refusal slower than this is not "at once" (deadline / 4)

    def __post_init__(self) -> None:
        if self.encoding not in ("json", "binary"):
            raise ConfigError(f"encoding must be json or binary, got {self.encoding!r}")
        if not 1 <= self.base_clients < self.clients:
            raise ConfigError(
                f"base_clients must be at least 1 and below clients ({self.clients}), got {self.base_clients}"
            )
        for name in ("base_s", "duration_s", "deadline_s", "window_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.warmup_s < 0 or self.slow_ms < 0 or not 0 < self.target_ratio <= 1:
            raise ConfigError(
                "warmup_s and slow_ms must be >= 0 and target_ratio in (0, 1], got "
                f"{self.warmup_s!r}, {self.slow_ms!r}, {self.target_ratio!r}"
            )

    @property
    def refusal_limit(self) -> float:
        return self.refusal_limit_s if self.refusal_limit_s is not None else self.deadline_s / 4.0


def run(
    config_path: str | Path, settings: OverloadSettings, progress: Progress | None = None
) -> dict[str, Any]:
    """The benchmark's JSON (module docstring)."""
    from failsoft.bench.serving import one_app_served

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with one_app_served(config_path, settings.app, "failsoft-bench-overload-state-", say) as (cfg, app):
        return _run(cfg, app.name, app.family, settings, say)


def _run(cfg: Any, app: str, family: str, settings: OverloadSettings, say: Progress) -> dict[str, Any]:
    from failsoft.bench.cluster import wait_home
    from failsoft.bench.serving import ServingSettings, Target, host_port, own_processes, request_body
    from failsoft.runtime.session import Session

    load = _load()
    with Session(cfg) as session, session.client(timeout=30.0) as client:
        wait_home(client, 300.0)
        route = next(a for a in client.status()["apps"] if a["name"] == app)["route"]
        assert session.prepared is not None  # started
        shape = tuple(session.prepared.models[family].input_shape)
        body = request_body(settings.encoding, shape, settings.deadline_s)
        host, port = host_port(session.url)
        if settings.slow_ms:
            client.admin("slow", server=route["server"], ms=settings.slow_ms)
        phases = {}
        for name, clients, seconds in _schedule(settings):
            say(f"[overload] {name}: {clients} clients for {seconds:g} s (+{settings.warmup_s:g} s warm-up)")
            level = ServingSettings(duration_s=seconds, warmup_s=settings.warmup_s)
            target = Target(host, port, app, body, level, own_processes)
            phases[name] = _phase(session, client, target, clients, settings)
        end = next(a for a in client.status()["apps"] if a["name"] == app)["route"]
        servers = {s["name"]: s["state"] for s in client.status()["servers"]}
    out: dict[str, Any] = {
        "benchmark": "overload",
        "app": app,
        "model": f"{family}/{route['variant']}",
        "server": route["server"],
        "settings": asdict(settings),
        "machine": {"cpus": os.cpu_count(), "load_before": load, "load_after": _load()},
        "phases": phases,
        "route_after": {"server": end["server"], "variant": end["variant"]},
        "servers_after": servers,
    }
    return out | verdict(out, settings)


def _schedule(settings: OverloadSettings) -> list[tuple[str, int, float]]:
    """The phases in order (name, clients, seconds): the base before and after the overload, so
    that a machine whose other load drifts during the run does not bias the ratio."""
    base = (settings.base_clients, settings.base_s)
    return [("base", *base), ("overload", settings.clients, settings.duration_s), ("base_after", *base)]


def _phase(
    session: Any, client: Any, target: Any, clients: int, settings: OverloadSettings
) -> dict[str, Any]:
    """One phase of closed-loop load: the client's figures, the queues' and the events over it."""
    from failsoft.bench.serving import measure

    events0, queues0 = _events(client), _queue_counters(session)
    result = measure(target, clients, None, backoff=settings.backoff, window_s=settings.window_s)
    events1, queues1 = _events(client), _queue_counters(session)
    seen = {json.dumps(e, sort_keys=True) for e in events0}
    new = [e for e in events1 if json.dumps(e, sort_keys=True) not in seen]
    queue = {k: queues1[k] - queues0[k] for k in QUEUE_COUNTERS}
    queue["mean_batch_rows"] = round(queue["rows"] / max(queue["batches"], 1), 2)
    result["queue"] = queue
    result["events"] = dict(Counter(e["type"] for e in new))
    return result


def verdict(out: dict[str, Any], settings: OverloadSettings) -> dict[str, Any]:
    """The goodput ratio and the issue's checks over the phases of ``out`` (module docstring)."""
    phases = out["phases"]
    base_rps = (phases["base"]["goodput_rps"] + phases["base_after"]["goodput_rps"]) / 2.0
    ratio = phases["overload"]["goodput_rps"] / base_rps if base_rps else 0.0
    events = Counter[str]()
    for phase in out["phases"].values():
        events.update(phase["events"])
    limit_ms = settings.refusal_limit * 1000.0
    bad: dict[str, dict[str, Any]] = {}  # per phase: neither a 200 nor a refusal at once with Retry-After
    for name, phase in out["phases"].items():
        for status, figures in phase["by_status"].items():
            if (
                status not in REFUSALS
                or figures["retry_after"] < figures["count"]
                or figures["max_ms"] > limit_ms
            ):
                bad.setdefault(name, {})[status] = figures
    checks = {
        "goodput": ratio >= settings.target_ratio,
        "no_failure_events": not any(events[t] for t in FAILURE_EVENTS)
        and out["route_after"]["server"] == out["server"]
        and all(state == "up" for state in out["servers_after"].values()),
        "answered_or_refused": not bad,
    }
    return {
        "base_rps": round(base_rps, 2),
        "goodput_ratio": round(ratio, 3),
        "target": f"goodput_ratio >= {settings.target_ratio}",
        "failure_events": {t: events[t] for t in FAILURE_EVENTS},
        "deadline_exceeded": sum(p["codes"].get("504", 0) for p in out["phases"].values()),
        "not_refused_at_once": bad,
        "checks": checks,
        "ok": all(checks.values()),
    }


def _events(client: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.recoveries()["events"]
    return events


def _queue_counters(session: Any) -> dict[str, float]:
    """Every agent's serving-queue counters, summed."""
    out = dict.fromkeys(QUEUE_COUNTERS, 0.0)
    for agent in session.agents.values():
        for queue in agent.info_sync()["queues"].values():
            for key in QUEUE_COUNTERS:
                out[key] += queue.get(key, 0)
    return out


def _load() -> list[float]:
    return [round(x, 1) for x in os.getloadavg()]
