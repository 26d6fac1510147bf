"""One simulated failure event, end to end, on SimPy (FailLite 5.1's failure injection).

The cluster starts in steady state: primaries and the deployment's warm backups are loaded, every
agent heartbeats at its own phase, the controller checks health at its own phase (both drawn from
the event's seed unless ``random_phases`` is off). At ``failure_at_s`` the given servers crash at
once (one server, a site, several sites). The controller detects them from missing heartbeats,
calls the policy and applies its plan; clients of the affected apps (or of all apps) issue requests
throughout. The event ends when every recovery, upgrade and request has run its course.

Speed: once every injected failure has been detected, heartbeats can no longer change anything in
the event, so agents stop pushing them (``heartbeats_after_detection`` keeps them going). With
requests off, an event costs a few SimPy events per server and per affected app, which is what lets
the 100-server sweeps fail every server in turn and a 1000-server cluster simulate in seconds.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import simpy

from failsoft.domain import BackupState
from failsoft.errors import ConfigError
from failsoft.orchestration import CopyRequest
from failsoft.sim.agent import SimAgent
from failsoft.sim.config import RequestMode, SimConfig
from failsoft.sim.controller import SimController
from failsoft.sim.cpu import SharedCPU, equivalent_competitors
from failsoft.sim.deploy import Deployment
from failsoft.sim.heartbeats import HeartbeatFeed
from failsoft.sim.metrics import EventResult, Recorder
from failsoft.sim.requests import RequestCore
from failsoft.sim.trace import EventLog


def simulate_failure(
    deployment: Deployment, failed: Sequence[str], config: SimConfig | None = None, seed: int | str = 0
) -> EventResult:
    """Crash ``failed`` at ``config.failure_at_s`` and simulate detection and recovery."""
    config = config or SimConfig()
    scenario = deployment.scenario
    failed = tuple(dict.fromkeys(failed))
    unknown = [s for s in failed if not scenario.has_server(s)]
    if not failed or unknown:
        raise ConfigError(f"failed servers must be named servers of the scenario; got {list(failed)}")
    rng = random.Random(f"{seed}/{','.join(failed)}")  # same phases for every policy
    down = set(failed)
    hit = {a.name for a in scenario.apps if a.primary is not None and a.primary.server in down}
    env, controller, requests, health = _event(deployment, failed, hit, config, rng)
    env.process(_inject(env, failed, controller.agents, controller, requests, config.failure_at_s))
    return _run_event(env, controller, requests, health, config)


def simulate_model_loss(
    deployment: Deployment, app: str, server: str, config: SimConfig | None = None, seed: int | str = 0
) -> EventResult:
    """``server`` loses ``app``'s model at ``config.failure_at_s`` while it lives on (the twin of
    ``failsoft chaos evict SERVER APP``), and the gateway's next call reports it at once: the core's
    ``model_lost`` input decides, as in the runtime (a pinned copy elsewhere is promoted, else the
    most accurate warm backup elsewhere takes over, else the model is reloaded in place, the app
    unrouted meanwhile), and loads take their profiled times as after a crash. The result holds
    one :class:`AppRecord` for ``app``: its ``recovery`` (``promoted``, ``warm`` or ``reload``) and
    its MTTR from the report to its client using the route again (the route's notification
    included, as for a crash). Nothing is detected (``detected_at`` stays empty): no server fails."""
    config = config or SimConfig()
    scenario = deployment.scenario
    if not scenario.has_app(app) or not scenario.has_server(server):
        raise ConfigError(
            f"model loss: app and server must be named in the scenario; got {app!r} on {server!r}"
        )
    primary = scenario.app(app).primary
    if primary is None or primary.server != server:
        where = "nowhere" if primary is None else f"{primary.server}/{primary.variant}"
        raise ConfigError(f"model loss: app {app!r} is served on {where}, not on server {server!r}")
    rng = random.Random(f"{seed}/lost/{app}@{server}")  # same phases for every policy
    env, controller, requests, health = _event(deployment, (), {app}, config, rng)
    env.process(_lose(env, controller, app, server, config.failure_at_s))
    return _run_event(env, controller, requests, health, config)


def _event(
    deployment: Deployment, failed: tuple[str, ...], hit: set[str], config: SimConfig, rng: random.Random
) -> tuple[simpy.Environment, SimController, RequestCore | None, simpy.Process]:
    """A cluster in steady state and its controller checking health; ``hit``: the apps the event
    affects (the clients simulated under ``RequestMode.AFFECTED``)."""
    scenario = deployment.scenario
    env = simpy.Environment()
    log = EventLog(config.trace)
    recorder = Recorder(scenario, deployment.label, failed, config.failure_at_s)
    agents = _agents(env, deployment, config, log)
    requests = _request_core(env, deployment, hit, config, rng)
    beat = config.heartbeat_interval_s
    phases = [(name, rng.uniform(0.0, beat) if config.random_phases else 0.0) for name in agents]
    feed = HeartbeatFeed(phases, beat)
    policy = deployment.policy
    controller = SimController(env, policy, scenario, agents, config, recorder, requests, log, feed)
    # Fixed phases put the checks half-way between heartbeats, so neither waits on the other.
    check_phase = rng.uniform(0.0, config.check_interval_s) if config.random_phases else beat / 2
    health = env.process(controller.health_loop(check_phase))
    return env, controller, requests, health


def _run_event(
    env: simpy.Environment,
    controller: SimController,
    requests: RequestCore | None,
    health: simpy.Process,
    config: SimConfig,
) -> EventResult:
    """Run the event until the core has nothing left to do and the clients are done, then drain."""
    arrivals = []
    if requests is not None:
        start = config.failure_at_s - config.request_warmup_s
        arrivals = requests.start(start, config.failure_at_s + config.request_window_s)
    env.run(until=simpy.AllOf(env, [health, *arrivals]))
    controller.stop()
    env.run()  # drain: requests in service, agents' last wake-ups
    result = controller.recorder.result
    result.oom_loads = sum(a.oom_loads for a in controller.agents.values())
    result.requests = requests.stats() if requests is not None else None
    result.end_s = float(env.now)
    result.log = controller.log.entries
    if config.trace and requests is not None:
        result.request_log = requests.issued
    return result


def simulate_pin(
    deployment: Deployment, request: CopyRequest, config: SimConfig | None = None, at_s: float = 1.0
) -> float | None:
    """A mechanism's copy asked for at ``at_s`` on a cluster in steady state (a Jellyfish ladder
    switch: the worker's next rung pinned on its server): the milliseconds until the core publishes
    it ready, as the runtime's ``wait_pinned`` sees it, or None when it never is. The load runs as
    every load does (profiled time, warm-up, the host's shared cores); nothing fails."""
    return simulate_pins(deployment, [(0.0, request)], config, at_s)[0]


def simulate_pins(
    deployment: Deployment,
    requests: Sequence[tuple[float, CopyRequest]],
    config: SimConfig | None = None,
    at_s: float = 1.0,
) -> list[float | None]:
    """Copies asked for ``offset`` seconds after ``at_s`` each, on one cluster in steady state, so
    that their loads overlap as they did in the runtime (``bench fidelity``'s control probe pins
    small copies while a heavy one loads): per request, the milliseconds from its ask until the
    core publishes it ready, or None when it never is."""
    config = config or SimConfig()
    env = simpy.Environment()
    log = EventLog(config.trace)
    scenario = deployment.scenario
    agents = _agents(env, deployment, config, log)
    feed = HeartbeatFeed([(name, 0.0) for name in agents], config.heartbeat_interval_s)
    recorder = Recorder(scenario, deployment.label, (), at_s)
    controller = SimController(env, deployment.policy, scenario, agents, config, recorder, None, log, feed)
    asked: dict[int, tuple[str, float]] = {}  # request index -> (its server, when it was asked)
    took: list[float | None] = [None] * len(requests)

    def ask(index: int, offset_s: float, request: CopyRequest) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at_s + max(offset_s, 0.0))
        asked[index] = (controller.pin(request), float(env.now))

    for index, (offset_s, request) in enumerate(requests):
        env.process(ask(index, offset_s, request))
    while env.peek() < float("inf") and any(t is None for t in took):
        env.step()
        for index, (server, asked_at) in asked.items():
            request = requests[index][1]
            rec = controller.state.warm.get((request.app, server))
            if took[index] is not None or rec is None or rec.state is not BackupState.WARM:
                continue
            if rec.backup.variant == request.variant:
                took[index] = (float(env.now) - asked_at) * 1000.0
    return took


def _agents(
    env: simpy.Environment, deployment: Deployment, config: SimConfig, log: EventLog
) -> dict[str, SimAgent]:
    """An agent per server on the host's cores, each holding its steady-state models."""
    cpu = shared_cpu(env, config)
    agents = {s.name: SimAgent(env, s, config, log, cpu) for s in deployment.scenario.servers}
    _preload(deployment, agents)
    return agents


def _preload(deployment: Deployment, agents: dict[str, SimAgent]) -> None:
    """Every agent holds its steady-state models (worked out once per deployment: a sweep starts
    thousands of events from the same one)."""
    for name, (models, used_mb) in deployment.steady_holdings().items():
        agents[name].models.update(models)
        agents[name].used_mb = used_mb


def _request_core(
    env: simpy.Environment,
    deployment: Deployment,
    hit: set[str],
    config: SimConfig,
    rng: random.Random,
) -> RequestCore | None:
    placed = [a.name for a in deployment.scenario.apps if a.primary is not None]
    if config.requests is RequestMode.OFF:
        return None
    if config.requests is RequestMode.AFFECTED:
        placed = [name for name in placed if name in hit]
    seed = f"{rng.random():.17f}"
    return RequestCore(env, deployment.scenario, placed, config, seed)


def _inject(
    env: simpy.Environment,
    failed: tuple[str, ...],
    agents: Mapping[str, SimAgent],
    controller: SimController,
    requests: RequestCore | None,
    at_s: float,
):
    yield env.timeout(at_s)
    for server in failed:
        agents[server].crash()
        if requests is not None:
            requests.crash(server)
    controller.injected(list(failed), done=True)


def _lose(env: simpy.Environment, controller: SimController, app: str, server: str, at_s: float):
    yield env.timeout(at_s)
    controller.model_lost(app, server)


def shared_cpu(env: simpy.Environment, config: SimConfig) -> SharedCPU | None:
    """The host's cores as ``config`` describes them (sim/cpu.py); None when servers have their own."""
    if config.host_cores is None:
        return None
    if config.host_load_share is not None:  # measured: the competitors that leave a load that share
        competitors = equivalent_competitors(config.host_cores, config.host_load_share)
        return SharedCPU(env, config.host_cores, competitors=competitors)
    return SharedCPU(env, config.host_cores, config.host_busy_cores, config.host_other_groups)
