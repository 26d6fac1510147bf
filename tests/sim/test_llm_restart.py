"""The core's LLM worker restart on SimPy (the twin of ``failsoft serve``'s ``llm`` recovery).

Three servers of 1000 MB, the ``llm`` service ``chat`` with w0, w1, w2 on s1, s2, s3 and a standby
on s1 (holding the draft: progressive recovery); a worker's target loads in 2 s, its draft in 0.5 s
(its profile).
"""

from __future__ import annotations

import pytest

from failsoft.domain import Server
from failsoft.orchestration import ClusterState, Orchestrator
from failsoft.orchestration.commands import StartLlmWorker, SwitchLlmTarget
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.sim.config import SimConfig
from failsoft.sim.controller import sim_settings
from failsoft.sim.llm.restart import simulate_llm_restart

SERVERS = tuple(Server(f"s{i}", "a", 1000, 10) for i in (1, 2, 3))
GROUP = LlmGroup("chat", ("w0", "w1", "w2"), ("s1", "s2", "s3"), ("s1",), 100, True, 2.0, 0.5)
CONFIG = SimConfig(random_phases=False, failure_at_s=3.0)


def test_a_killed_worker_drafts_after_its_draft_loads_and_serves_after_its_target():
    result = simulate_llm_restart(SERVERS, GROUP, "worker", "w1", CONFIG)
    assert [e["type"] for e in result.events] == [
        "llm-worker-failed",
        "llm-worker-draft",
        "llm-worker-recovered",
    ]
    assert result.event("llm-worker-draft")["server"] == "s1"  # the standby adopted it
    assert result.event("llm-worker-draft")["draft_ms"] == 0.0  # it holds the draft already
    assert result.event("llm-worker-recovered")["restart_ms"] == 2000.0  # the target behind it


def test_a_restart_without_a_standby_loads_the_draft_first_then_the_target():
    group = LlmGroup("chat", ("w0", "w1", "w2"), ("s1", "s2", "s3"), (), 100, True, 2.0, 0.5)
    result = simulate_llm_restart(SERVERS, group, "worker", "w1", CONFIG)
    assert result.event("llm-worker-draft")["server"] == "s2"  # in place: no standby
    assert result.event("llm-worker-draft")["draft_ms"] == 500.0
    assert result.event("llm-worker-recovered")["restart_ms"] == 2500.0  # draft, then target


def test_a_crashed_server_is_detected_by_heartbeats_then_its_worker_restarts_elsewhere():
    result = simulate_llm_restart(SERVERS, GROUP, "server", "s3", CONFIG)
    failed = result.event("llm-worker-failed")
    assert failed["worker"] == "w2" and failed["reason"] == "server s3 failed"
    detection_s = failed["at_s"] - result.crashed_at_s
    hb = CONFIG.heartbeat_interval_s
    assert CONFIG.missed_to_fail * hb - hb <= detection_s <= (CONFIG.missed_to_fail + 1) * hb
    recovered = result.event("llm-worker-recovered")
    assert recovered["server"] == "s1"
    assert recovered["at_s"] - result.crashed_at_s == pytest.approx(detection_s + 2.0)


def test_the_same_crash_gives_the_runtime_core_and_the_sim_core_the_same_commands():
    """The runtime's controller feeds the core what its fleet reports; here those reports are fed
    by hand at the times the worker's profile gives, and the commands must be the simulator's."""
    sim = simulate_llm_restart(SERVERS, GROUP, "worker", "w1", CONFIG)
    from failsoft.domain import PolicyParams, Scenario

    state = ClusterState.deployed(Scenario(SERVERS, (), (), PolicyParams(), ()))
    core = Orchestrator(state, sim_settings(CONFIG), 0.0)
    core.assume_deployed(0.0)
    seen: list[tuple[float, str, object]] = []
    pending: list[tuple[float, object]] = []

    def run(t: float, commands: list[object]) -> None:
        for c in commands:
            if hasattr(c, "service"):  # the LLM commands (an Emit has fields, not a service)
                seen.append((t, type(c).__name__, c))
                if isinstance(c, StartLlmWorker | SwitchLlmTarget):  # what the fleet reports, and when
                    draft = isinstance(c, StartLlmWorker) and c.draft_first
                    preloaded = draft and isinstance(c, StartLlmWorker) and c.standby
                    at = t + ((0.0 if preloaded else GROUP.draft_load_s) if draft else GROUP.target_load_s)
                    pending.append((at, (c.worker, c.incarnation, "draft" if draft else "serving")))

    def report_until(t_end: float) -> None:
        while pending and min(p[0] for p in pending) <= t_end:
            at, (worker, inc, phase) = min(pending, key=lambda p: p[0])
            pending.remove((at, (worker, inc, phase)))
            run(at, core.llm_started("chat", worker, inc, phase, at))

    run(0.0, core.place_llm(GROUP, 0.0))
    report_until(sim.crashed_at_s)
    incarnation = state.llm.workers[("chat", "w1")].incarnation
    began, commands = core.llm_died("chat", "w1", incarnation, "killed", sim.crashed_at_s)
    assert began
    run(sim.crashed_at_s, commands)
    report_until(float("inf"))
    runtime = [(round(t, 9), kind, _fields(c)) for t, kind, c in seen]
    assert runtime == [(t, kind, fields) for t, kind, fields in sim.commands]
    after = [kind for t, kind, _ in runtime if t >= sim.crashed_at_s]
    assert after == [
        "StopLlmWorker", "StartLlmStandby", "StartLlmWorker", "PublishLlm",  # the crash
        "SwitchLlmTarget", "PublishLlm",  # its draft serves
        "PublishLlm",  # its target serves
    ]  # fmt: skip


def _fields(command: object) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(command)  # type: ignore[call-overload]
