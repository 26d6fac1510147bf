"""``bench fidelity`` on a config with a Jellyfish (``slo``) service: its ladder switches, twinned.

A Jellyfish worker switches rung by asking the core for a pinned copy of the new variant on its
server (``dispatch/slo.py``) and serves it once the routing table publishes it ready. Both halves of
that are the core's, so the simulator twins them (:func:`failsoft.sim.simulate_pin`). Before the
kill of each ``bench fidelity`` run, on the stable cluster:

1. **runtime**: for every slo worker not on a killed server and every other variant of its family
   (smallest first), the benchmark asks the controller for that rung on the worker's server as the
   dispatcher does, times it from the request until the routing table (long-polled) publishes it
   ready, then gives it up and waits for the drain, so that each switch starts from the same cluster;
   the share of a core a load got just before (the agents' probe) is kept for the twin, and so are
   small pins of other apps made just before the switches at their priority (``calm_probe``): the
   control path's cost as the switches meet it, which the crash's probe (under the steady load,
   beside a heavy pin) does not give;
2. **simulator**: the same request on the same deployment (the copies loaded then), the same
   settings as the crash's twin and that probe (:func:`failsoft.bench.fidelity.simulate_switches`);
3. per switch, ``|sim - runtime| / runtime``, and the median, in the output's ``switches``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from failsoft.orchestration import CopyRequest
from failsoft.orchestration.loads import Priority
from failsoft.runtime.config import RuntimeConfig
from failsoft.services import ServiceMode

OWNER = "slo:bench-fidelity"  # a mechanism's owner name: the core keeps its copy apart from others
SWITCH_TIMEOUT_S = 60.0


def slo_members(config: RuntimeConfig) -> list[str]:
    """The workers of the config's slo services."""
    return [m for s in config.services if s.mode is ServiceMode.SLO for m in s.members]


def measure(config: RuntimeConfig, failed: Sequence[str], session: Any, client: Any) -> dict[str, Any]:
    """The runtime half (see the module docstring): the switches, the copies loaded before them and
    the load share the agents' probe found."""
    from failsoft.bench.failover import AgentProbes, loaded_copies
    from failsoft.runtime.session import prepare

    scenario = prepare(config).deployment
    status = client.status()
    routes = {a["name"]: a["route"] for a in status["apps"]}
    shares = AgentProbes([s.name for s in config.servers]).load_cpu_shares()
    copies = loaded_copies(status)
    drain_s = config.agents.drain_ms / 1000.0
    # the control path's cost as the switches meet it (this calm cluster, a warm copy's priority),
    # from small pins of other apps than theirs: the crash's probe meets a loaded host
    survivors = [s.name for s in config.servers if s.name not in failed]
    small = _small_probes(scenario, survivors, _holders(routes, copies), None, urgent=False)
    calm = asyncio.run(_probe_pins(session.controller, [], small, drain_s))
    events = []
    for app in slo_members(config):
        route = routes.get(app)
        if route is None or route["server"] in failed:
            continue
        family = scenario.family(scenario.app(app).family)
        for variant in sorted(family.variants, key=lambda v: v.memory_mb):
            if variant.name == route["variant"]:
                continue
            event = {"app": app, "server": route["server"], "variant": variant.name}
            ms = asyncio.run(_switch(session.controller, request(event), drain_s))
            events.append(event | {"runtime_ms": ms})
    host_cpu = {"load_cpu_share": shares}
    return {
        "events": events,
        "warm": copies,
        "host_cpu": host_cpu,
        "calm_probe": {"events": calm, "warm": copies, "host_cpu": host_cpu},
    }


PROBE_PINS = 3  # small control probes per run, spread over the surviving servers in turn


def probe(config: RuntimeConfig, failed: Sequence[str], session: Any, client: Any) -> dict[str, Any]:
    """The control probe: the fixed cost of the control path (the controller's call to the agent and
    back, the agent's pick-up, the hand-overs between threads and processes, the route's
    publication), which the twin does not simulate step by step, measured as a crash meets it.

    On the stable cluster, under the steady load, the config's lightest heavy variant is pinned on a
    survivor with room for it (``heavy``) and, while it loads, :data:`PROBE_PINS` small copies one after
    another (:func:`_small_probes`), each timed from its ask until published ready (``offset_ms``: its
    ask, after the heavy one's). Every pin is asked at the priority of a failover load (``urgent``).
    Both choices make the probe meet the host as a recovery does: a recovery's heavy loads saturate the
    cores, and on a saturated host each hand-over of a small load waits for a core, for longer at a
    lower priority (the wait, not the work, is most of a small load's time). The twin simulates the same
    pins at the same offsets with no control cost and takes the median difference of the small ones as
    its ``control_ms`` (:func:`control_ms`); the heavy one feeds the ``pin`` host model. ``cpu``
    records the host's busy cores over the pins (and the drain after them) by scheduling group, as
    :class:`~failsoft.zoo.machine.HostCpu` splits them, with the CPU the agents' loads took meanwhile
    (``loads_cpu_ms``). Recorded, not used by the twin: a model that took the cluster's CPU there,
    less the steady load's and the loads', as the control path's work was withdrawn, since that came
    to more than the small pins took (docs/simulator.md, "Why ahead")."""
    from failsoft.bench.failover import AgentProbes, loaded_copies
    from failsoft.runtime.session import prepare
    from failsoft.zoo.machine import HostCpu

    scenario = prepare(config).deployment
    status = client.status()
    routes = {a["name"]: a["route"] for a in status["apps"]}
    agents = AgentProbes([s.name for s in config.servers])
    shares = agents.load_cpu_shares()
    copies = loaded_copies(status)
    holders = _holders(routes, copies)
    heavy = _heavy_probe(scenario, routes, copies, failed)
    survivors = [s.name for s in config.servers if s.name not in failed]
    small = _small_probes(scenario, survivors, holders, heavy["app"] if heavy is not None else None)
    lead = [heavy | {"urgent": True, "heavy": True}] if heavy is not None else []
    loads_before, meter = agents.loads_cpu_ms(), HostCpu()
    events = asyncio.run(_probe_pins(session.controller, lead, small, config.agents.drain_ms / 1000.0))
    cpu = meter.read()  # the pins' window (and the drain after them): what the control path took
    cpu["loads_cpu_ms"] = round(agents.loads_cpu_ms_since(loads_before), 3)
    return {"events": events, "warm": copies, "host_cpu": {"load_cpu_share": shares}, "cpu": cpu}


HEAVY_LEAD_S = 0.03  # the small pins start this long after the heavy one: its load under way


async def _probe_pins(
    controller: Any, lead: list[dict[str, Any]], small: list[dict[str, Any]], drain_s: float
) -> list[dict[str, Any]]:
    """The heavy pin (if any), and the small ones one after another while it loads; each timed
    from its ask to published ready, its ask's offset after the first; then all given up."""
    started = time.perf_counter()
    tasks = [asyncio.create_task(_pinned(controller, request(e))) for e in lead]
    if tasks:
        await asyncio.sleep(HEAVY_LEAD_S)
    timed = []
    for event in small:
        offset = (time.perf_counter() - started) * 1000.0
        ms, seen = await _pinned(controller, request(event))
        timed.append(event | {"offset_ms": offset, "runtime_ms": ms, "seen_ms": seen})
    heavy = []
    for event, task in zip(lead, tasks, strict=True):
        ms, seen = await task
        heavy.append(event | {"offset_ms": 0.0, "runtime_ms": ms, "seen_ms": seen})
    for event in [*heavy, *timed]:
        await controller.unpin(event["app"], event["server"], OWNER)
    await asyncio.sleep(drain_s + 0.5)  # unloaded after the drain period: the crash starts clean
    return [*timed, *heavy]


def _small_probes(
    scenario: Any,
    survivors: Sequence[str],
    holders: dict[str, set[str]],
    skip: str | None,
    urgent: bool = True,
) -> list[dict[str, Any]]:
    """Up to :data:`PROBE_PINS` small pins, the surviving servers taken in turn: on each, the next
    app (fastest-loading first) holding no copy there, in its fastest-loading variant if that one
    is small (never the heavy probe's app). Several pins, even on a single survivor, so that the
    control cost is a median, not one sample of a noisy wait. ``urgent``: at a failover load's
    priority (the crash's probe), else at a warm copy's (the switches' calm probe)."""
    from failsoft.orchestration.loads import is_heavy

    fastest = {
        a.name: min(scenario.family(a.family).variants, key=lambda v: v.load_ms) for a in scenario.apps
    }
    queues = {
        server: sorted(
            (v.load_ms, app, v.name)
            for app, v in fastest.items()
            if server not in holders.get(app, set()) and app != skip and not is_heavy(v)
        )
        for server in survivors
    }
    picks: list[dict[str, Any]] = []
    while len(picks) < PROBE_PINS and any(queues.values()):
        for server in survivors:
            if queues[server] and len(picks) < PROBE_PINS:
                _, app, variant = queues[server].pop(0)
                picks.append({"app": app, "server": server, "variant": variant, "urgent": urgent})
    return picks


def _holders(routes: dict[str, Any], copies: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per app, the servers holding a copy of it (its route's and every loaded copy's)."""
    out: dict[str, set[str]] = {}
    for app, route in routes.items():
        if route:
            out.setdefault(app, set()).add(route["server"])
    for c in copies:
        out.setdefault(c["app"], set()).add(c["server"])
    return out


def _heavy_probe(
    scenario: Any, routes: dict[str, Any], copies: list[dict[str, Any]], failed: Sequence[str]
) -> dict[str, Any] | None:
    """The heavy probe's pin: the config's lightest heavy variant (least profiled work of those
    :func:`~failsoft.orchestration.loads.is_heavy`), of an app with that family, on the first
    surviving server holding no copy of the app and with room for it beside what it holds; None
    when there is none."""
    from failsoft.orchestration.loads import is_heavy

    candidates = sorted(
        (
            (v.load_work_ms, a.name, v)
            for a in scenario.apps
            for v in scenario.family(a.family).variants
            if is_heavy(v)
        ),
        key=lambda c: (c[0], c[1], c[2].name),
    )
    used = dict.fromkeys((s.name for s in scenario.servers), 0.0)
    held = [(a, r["server"], r["variant"]) for a, r in routes.items() if r] + [
        (c["app"], c["server"], c["variant"]) for c in copies
    ]
    for app, server, name in held:  # what each server holds now: a pin must fit beside it
        family = scenario.family(scenario.app(app).family)
        used[server] = used.get(server, 0.0) + next(v.memory_mb for v in family.variants if v.name == name)
    holders = _holders(routes, copies)
    for _, app, variant in candidates:
        for server in scenario.servers:
            free = server.memory_mb - used[server.name]
            if (
                server.name not in failed
                and server.name not in holders.get(app, set())
                and free >= variant.memory_mb
            ):
                return {"app": app, "server": server.name, "variant": variant.name}
    return None


def pins_of(events: Sequence[dict[str, Any]]) -> list[tuple[float, CopyRequest]]:
    """The probe's pins as :func:`failsoft.sim.simulate_pins` takes them: each at its recorded
    offset (seconds)."""
    return [(float(e.get("offset_ms") or 0.0) / 1000.0, request(e)) for e in events]


def hop_ms(events: Sequence[dict[str, Any]]) -> float:
    """One hand-over between processes on the controller's loop, as the host was before the kill:
    half of what the small probes' pins took longer seen from the benchmark (a call to the
    controller, a table read back) than on the controller's clock, the median (0 for runs recorded
    without both times). A crash spends one on the controller's reaction, detection to the plan
    asked for (``SimConfig.plan_wait_ms``)."""
    gaps = [
        (e["seen_ms"] - e["runtime_ms"]) / 2.0
        for e in events
        if not e.get("heavy") and e.get("seen_ms") is not None and e.get("runtime_ms") is not None
    ]
    return max(statistics.median(gaps), 0.0) if gaps else 0.0


def control_ms(compared_events: Sequence[dict[str, Any]]) -> float:
    """The control path's fixed cost from probes simulated without it: the median of runtime minus
    simulated milliseconds, never below zero (0 when nothing was measured); the heavy probe's pin
    measures the host's share, not the control path, and is left out."""
    gaps = [
        e["runtime_ms"] - e["sim_ms"]
        for e in compared_events
        if e.get("runtime_ms") is not None and e.get("sim_ms") is not None and not e.get("heavy")
    ]
    return max(statistics.median(gaps), 0.0) if gaps else 0.0


def control_work_ms(twin: Callable[[float], Sequence[dict[str, Any]]]) -> float:
    """The control path as work (``SimConfig.control_work_ms``): the milliseconds of a core at which
    the probes' twins (``twin(work)``: the probes compared, simulated with that work) take as long
    as the runtime's did, the median of runtime minus simulated milliseconds at zero (to 1/4096 of
    the gap without it); 0 when the twins are as slow without any."""
    gap = control_ms(twin(0.0))
    if gap <= 0:
        return 0.0
    low, high = 0.0, gap  # work runs at most at a core's speed: ``gap`` of it adds at least ``gap``
    for _ in range(CONTROL_DOUBLINGS):  # ... unless it moves the pins past a load that slowed them
        if control_ms(twin(high)) <= 0:
            break
        low, high = high, high * 2
    for _ in range(CONTROL_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if control_ms(twin(mid)) > 0 else (low, mid)
    return (low + high) / 2


CONTROL_STEPS, CONTROL_DOUBLINGS = 12, 4  # the control work's bisection steps, and its range's growth


def request(event: dict[str, Any]) -> CopyRequest:
    """The core's request for one switch or probe: the variant pinned on the event's server, at a
    failover load's priority when the event is ``urgent`` (a control probe), else at a warm
    backup's (a ladder switch, and probes recorded before the urgent ones)."""
    priority = Priority.FAILOVER if event.get("urgent") else Priority.WARM
    return CopyRequest(event["app"], event["variant"], OWNER, event["server"], priority=priority)


async def _switch(controller: Any, request: CopyRequest, drain_s: float) -> float | None:
    """Pin, time until published ready (None: never within the timeout), give up, let it drain."""
    took, _ = await _pinned(controller, request)
    await controller.unpin(request.app, str(request.server), OWNER)
    await asyncio.sleep(drain_s + 0.5)  # unloaded after the drain period: the next starts clean
    return took


async def _pinned(controller: Any, request: CopyRequest) -> tuple[float | None, float | None]:
    """Pin, and the milliseconds until the routing table publishes it ready (None: never within
    :data:`SWITCH_TIMEOUT_S`): on the controller's clock, from the first table that lists the copy
    (published at the ask) to the first that lists it ready, as a recovery's MTTR is timed inside
    the controller (the calls to the controller and back are left out: under a saturated host each
    is milliseconds of waiting for a core that no recovery spends; a table that never listed it
    loading, a newer one having come first, times it from this process's ask instead); and beside
    it the time this process saw, from its ask to the table read."""
    snap = await controller.wait_routes("", -1, 5.0)
    started = time.perf_counter()
    await controller.pin(request)
    listed_at = None
    while time.perf_counter() - started < SWITCH_TIMEOUT_S:
        snap = await controller.wait_routes(snap["epoch"], snap["version"], 5.0)
        entry = (snap.get("value") or {}).get(request.app) or {}
        mine = [
            p
            for p in entry.get("pinned", ())
            if (p["server"], p["variant"]) == (request.server, request.variant)
        ]
        stamp = snap.get("published_at")
        if mine and any(p["ready"] for p in mine):
            seen = (time.perf_counter() - started) * 1000.0
            if listed_at is None or stamp is None:
                return seen, seen
            return (float(stamp) - listed_at) * 1000.0, seen
        if mine and listed_at is None and stamp is not None:
            listed_at = float(stamp)
    return None, None


def compared(event: dict[str, Any], sim_ms: float | None) -> dict[str, Any]:
    """One switch, runtime and simulated, with its error."""
    rt = event["runtime_ms"]
    error = abs(sim_ms - rt) / rt * 100.0 if sim_ms is not None and rt else None
    return event | {"sim_ms": _round(sim_ms), "error_pct": _round(error)}


def summarize(per_run: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Every switch of every run, and the median error over them."""
    events = [e for run in per_run for e in run]
    errors = [e["error_pct"] for e in events if e["error_pct"] is not None]
    return {
        "events": events,
        "median_abs_error_pct": round(statistics.median(errors), 1) if errors else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
