"""A model lost on a live server, twinned: the simulator feeds the core's ``model_lost`` input as the
runtime's gateway does (``failsoft chaos evict``), and the core decides as in the runtime.

On the tiny cluster (``sim_tiny``: s0 serves A, B and C on ``big``; A has a warm ``small`` backup on
s1), with B given a pinned ``big`` copy on s2 (HAMS's backup), s0 loses one model at 0.31 s and
lives on. Each case checks that the twin takes the decision the core takes when fed the same loss
directly (the object the runtime's controller drives), and the record's times against the hand
computation: a switch serves after the route's notification (10 ms), a reload in place after the
profiled load of ``big`` (1 s) and the notification.
"""

from __future__ import annotations

import dataclasses

import pytest
from sim_tiny import BIG, FAILURE_AT, NOTIFY_S, tiny_scenario

from failsoft.domain import ActionKind, Scenario, WarmBackup
from failsoft.errors import ConfigError
from failsoft.orchestration import ClusterState, Emit, Load, Orchestrator
from failsoft.sim import Deployer, RequestMode, SimConfig, simulate_model_loss
from failsoft.sim.controller import sim_settings


def scenario() -> Scenario:
    return tiny_scenario().replace(
        warm=(WarmBackup("A", "small", "s1"), WarmBackup("B", "big", "s2", pinned=True))
    )


def core_decision(config: SimConfig, app: str) -> tuple[str, str]:
    """What the core decides when told directly that s0 lost ``app``'s model: the failover's kind
    and server, or ``reload`` and the server of the load in place."""
    core = Orchestrator(ClusterState.deployed(scenario()), sim_settings(config), 0.0)
    core.assume_deployed(0.0)
    out = core.model_lost(app, "s0", "big", FAILURE_AT, "call")
    failovers = [c.fields for c in out if isinstance(c, Emit) and c.type == "failover"]
    if failovers:
        return failovers[0]["kind"], failovers[0]["server"]
    (load,) = [c for c in out if isinstance(c, Load) and c.app == app]
    return "reload", load.server


@pytest.mark.parametrize(
    ("app", "recovery", "server", "kind", "mttr_s"),
    [
        ("B", "promoted", "s2", ActionKind.WARM, NOTIFY_S),  # HAMS's copy holds the state
        ("A", "warm", "s1", ActionKind.WARM, NOTIFY_S),  # FailLite's warm backup, then home
        ("C", "reload", "s0", ActionKind.COLD, BIG.load_ms / 1000 + NOTIFY_S),  # nothing elsewhere
    ],
)
def test_the_twin_takes_the_cores_decision_with_the_profiled_times(
    fixed, app, recovery, server, kind, mttr_s
):
    config = dataclasses.replace(fixed, requests=RequestMode.OFF)
    event = simulate_model_loss(Deployer().deploy(scenario(), "faillite"), app, "s0", config)
    assert core_decision(config, app) == (recovery, server)
    (record,) = event.apps.values()
    assert (record.app, record.failed_server, record.recovery) == (app, "s0", recovery)
    assert (record.kind, record.server) == (kind, server)
    assert record.detected_at == pytest.approx(FAILURE_AT)  # reported by the next call, at once
    assert record.mttr_ms == pytest.approx(mttr_s * 1000)
    assert event.failed == () and event.detected_at == {}  # no server failed
    assert [(e.kind, e.app, e.server) for e in event.log][:2] == [
        ("unloaded", app, "s0"),
        ("lost", app, "s0"),
    ]


def test_a_warm_switch_returns_home_once_the_home_has_reloaded(fixed):
    config = dataclasses.replace(fixed, requests=RequestMode.OFF)
    event = simulate_model_loss(Deployer().deploy(scenario(), "faillite"), "A", "s0", config)
    served = [(e.t, e.server, e.variant) for e in event.log if e.kind == "serving" and e.app == "A"]
    assert served == [
        (pytest.approx(FAILURE_AT), "s1", "small"),
        (pytest.approx(FAILURE_AT + BIG.load_ms / 1000), "s0", "big"),
    ]
    record = event.apps["A"]
    assert record.variant == "big" and record.final_at == pytest.approx(FAILURE_AT + BIG.load_ms / 1000)


def test_requests_that_find_the_model_gone_are_answered_once_it_is_reloaded(fixed):
    """C's client (requests on) holds what it sends while C is unrouted, and sends it on the reload."""
    event = simulate_model_loss(Deployer().deploy(scenario(), "faillite"), "C", "s0", fixed)
    assert event.requests is not None and event.requests.total > 0
    assert event.requests.unserved == 0 and event.requests.dropped == 0
    back_at = FAILURE_AT + BIG.load_ms / 1000
    waited = [r for r in event.request_log if FAILURE_AT <= r.issued_at < back_at]
    assert waited and all(r.done_at == pytest.approx(back_at + BIG.latency_ms / 1000) for r in waited)


def test_a_loss_that_names_no_routed_copy_is_refused_with_what_is_wrong(fixed):
    deployment = Deployer().deploy(scenario(), "faillite")
    with pytest.raises(ConfigError, match="app 'A' is served on s0/big, not on server 's1'"):
        simulate_model_loss(deployment, "A", "s1", fixed)
    with pytest.raises(ConfigError, match="got 'Z' on 's0'"):
        simulate_model_loss(deployment, "Z", "s0", fixed)
