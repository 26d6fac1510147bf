"""The core's restart of an LLM worker on SimPy: the twin of ``failsoft serve``'s ``llm`` recovery.

:mod:`failsoft.sim.llm.cluster` simulates LUMEN's requests (checkpoints, recovery dispatch, drafting)
on a cluster of its own; this module simulates the *orchestration* of a worker's restart with the
runtime's own core (:class:`~failsoft.orchestration.Orchestrator`, driven by
:class:`~failsoft.sim.controller.SimController`): the servers heartbeat, the same failure detector
judges them, the core places the workers (capacity counted), fails a worker whose process dies or
whose server crashes, and restarts it where the runtime would (a standby, in place, another server),
its draft first under progressive recovery; each start takes the worker's measured load times
(:class:`~failsoft.orchestration.llm_state.LlmGroup`: ``draft_load_s``, ``target_load_s``, from the
model's ``profile.json``). The result's times are what the runtime's events carry
(``llm-worker-draft``'s ``draft_ms``, ``llm-worker-recovered``'s ``restart_ms``), so a measured
restart can be set beside its simulated twin.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

import simpy

from failsoft.domain import PolicyParams, Scenario, Server
from failsoft.errors import ConfigError
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.policies.registry import get_failover_policy
from failsoft.sim.agent import SimAgent
from failsoft.sim.config import SimConfig
from failsoft.sim.controller import SimController
from failsoft.sim.heartbeats import HeartbeatFeed
from failsoft.sim.metrics import Recorder
from failsoft.sim.trace import EventLog


@dataclass(frozen=True, slots=True)
class LlmRestartResult:
    """One simulated worker failure: the events the core emitted (``type`` and fields, times in
    simulated seconds), and the LLM commands it issued, each ``[time_s, kind, fields]``."""

    crash: str  # "worker" or "server"
    victim: str
    crashed_at_s: float
    events: tuple[dict[str, Any], ...]
    commands: tuple[tuple[float, str, dict[str, Any]], ...]

    def event(self, event_type: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == event_type), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "crash": self.crash,
            "victim": self.victim,
            "crashed_at_s": self.crashed_at_s,
            "draft_ms": (self.event("llm-worker-draft") or {}).get("draft_ms"),
            "restart_ms": (self.event("llm-worker-recovered") or {}).get("restart_ms"),
            "events": list(self.events),
            "commands": [list(c) for c in self.commands],
        }


def simulate_llm_restart(
    servers: tuple[Server, ...],
    group: LlmGroup,
    crash: str,
    victim: str,
    config: SimConfig | None = None,
) -> LlmRestartResult:
    """Place ``group`` on ``servers`` at time 0 (each worker's first start takes its target's load
    time), then at ``config.failure_at_s`` (moved past the first starts when it is earlier) kill
    worker ``victim``'s process (``crash="worker"``) or crash server ``victim`` (``"server"``), and
    run until the core has nothing left to do."""
    config = config or SimConfig(random_phases=False)
    settled = group.target_load_s + config.heartbeat_interval_s
    if config.failure_at_s < settled:
        config = dataclasses.replace(config, failure_at_s=settled)
    if crash not in ("worker", "server"):
        raise ConfigError(f"crash must be 'worker' or 'server'; got {crash!r}")
    names = {s.name for s in servers}
    if crash == "server" and victim not in names:
        raise ConfigError(f"no server {victim!r} to crash (servers: {', '.join(sorted(names))})")
    if crash == "worker" and victim not in group.workers:
        raise ConfigError(f"no worker {victim!r} (workers: {', '.join(group.workers)})")
    env = simpy.Environment()
    log = EventLog(False)
    scenario = Scenario(servers, (), (), PolicyParams(), ())
    agents = {s.name: SimAgent(env, s, config, log) for s in servers}
    feed = HeartbeatFeed([(name, 0.0) for name in agents], config.heartbeat_interval_s)
    failed = (victim,) if crash == "server" else ()
    recorder = Recorder(scenario, "llm", failed, config.failure_at_s)
    controller = SimController(
        env, get_failover_policy("faillite"), scenario, agents, config, recorder, None, log, feed
    )
    controller.place_llm(group)
    health = env.process(controller.health_loop(config.heartbeat_interval_s / 2))
    env.process(_inject(env, controller, agents, crash, victim, group, config.failure_at_s))
    env.run(until=health)
    controller.stop()
    env.run()
    commands = tuple((round(t, 9), type(c).__name__, asdict(c)) for t, c in controller.llm_commands)
    after = tuple(e for e in controller.llm_events if e["at_s"] >= config.failure_at_s)
    return LlmRestartResult(crash, victim, config.failure_at_s, after, commands)


def _inject(
    env: simpy.Environment,
    controller: SimController,
    agents: dict[str, SimAgent],
    crash: str,
    victim: str,
    group: LlmGroup,
    at_s: float,
) -> Any:
    yield env.timeout(at_s)
    if crash == "server":
        agents[victim].crash()
        controller.injected([victim], done=True)
    else:
        controller.llm_worker_died(group.service, victim)
        controller.injected([], done=True)


__all__ = ["LlmRestartResult", "simulate_llm_restart"]
