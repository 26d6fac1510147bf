"""Replicas in the core: placed, counted, replaced when their server fails, switched to when the
route's server fails, and scaled by the autoscaler on the ongoing requests it is fed.

The cluster of :mod:`tests.orchestration.test_core` plus app R (``big``, 300 MB) on ``s0`` with its
replicas: ``s0`` 1000 MB (A, B, C, R: 1200 MB would not fit, so only A and B are there), ``s1``
400 MB holding A's warm ``small`` (100 MB), ``s2`` 450 MB.
"""

from __future__ import annotations

import pytest

from failsoft.domain import App, Autoscaling, BackupState, Placement, Scenario, Server, WarmBackup
from failsoft.orchestration import (
    ClusterState,
    InspectPurpose,
    Load,
    Orchestrator,
    Priority,
    Publish,
    Unload,
)
from tests.orchestration.test_core import HB, Harness, cluster


def with_r(replicas: int = 2, autoscaling: Autoscaling | None = None, s3: bool = False) -> Scenario:
    base = cluster()
    a, b, _ = base.apps
    r = App("R", "fam", Placement("s0", "big"), False, 1.0, 100.0, replicas, autoscaling)
    servers = base.servers + ((Server("s3", "c", 350, 10),) if s3 else ())
    return base.replace(apps=(a, b, r), servers=servers)


def serving(h: Harness, app: str = "R") -> list[str]:
    return [p.server for p in h.state.serving(app)]


def fail(h: Harness, server: str, t0: float = 0.0, until: float = 0.2) -> None:
    """Every server heartbeats from ``t0``; ``server`` stops after ``t0 + 0.06``; checks every 5 ms."""
    k = 0
    while t0 + k * HB <= t0 + until + 1e-9:
        t = t0 + k * HB
        for s in h.state.servers:
            if s != server or t < t0 + 0.07:
                h.take(h.core.heartbeat(s, t))
        h.take(h.core.check_health(t + 0.0025))
        k += 1


def test_a_replica_is_loaded_at_the_warm_priority_published_once_ready_and_counted():
    h = Harness(with_r(2))
    (load,) = [c for c in h.of(Load) if c.app == "R"]
    assert (load.server, load.variant, load.priority) == ("s2", "big", Priority.WARM)  # roomiest
    entry = h.state.routes()["R"]["replicas"]
    assert entry == {"wanted": 2, "autoscaling": False, "serving": [], "draining": []}  # loading
    out = h.finish("R", "big", 0.5)
    assert h.of(Publish, out)
    assert serving(h) == ["s0", "s2"]
    assert h.state.routes()["R"]["replicas"]["serving"] == [
        {"server": "s2", "variant": "big", "accuracy": 0.8}
    ]
    assert h.state.status()["apps"][2]["replicas"] == {"wanted": 2, "serving": ["s0", "s2"], "loading": []}
    less = h.state.snapshot(with_warm=False)  # the warm-backup planner plans in what is left
    assert next(s for s in less.servers if s.name == "s2").memory_mb == 150
    assert h.state.to_docs()["scale"]["R"] == {"replicas": 2}


def test_no_room_means_no_replica_until_capacity_is_freed():
    h = Harness(with_r(3))  # s2 takes one; s1 has 300 MB free of its 400 (A's backup): a second fits
    loads = sorted(c.server for c in h.of(Load) if c.app == "R")
    assert loads == ["s1", "s2"]
    h2 = Harness(with_r(3).replace(warm=(), servers=(*with_r(3).servers[:2], Server("s2", "b", 100, 10))))
    assert sorted(c.server for c in h2.of(Load) if c.app == "R") == ["s1"]  # s2 is too small
    h2.take(h2.core.advance(1.0))
    assert sorted(c.server for c in h2.of(Load) if c.app == "R") == ["s1"]  # not tried in a loop


def test_a_replica_lost_with_its_server_is_replaced_on_another():
    h = Harness(with_r(2))
    h.finish("R", "big", 0.05)
    fail(h, "s2")
    assert h.state.servers["s2"].state.value == "failed"
    assert serving(h) == ["s0"]
    (load,) = [c for c in h.loads.values() if c.app == "R"]
    assert load.server == "s1"  # 300 MB left beside A's backup
    h.finish("R", "big", 0.3)
    assert serving(h) == ["s0", "s1"]


def test_the_routes_server_failing_switches_to_a_replica_at_once_as_a_warm_failover():
    h = Harness(with_r(2, s3=True))
    h.finish("R", "big", 0.05)
    assert serving(h) == ["s0", "s2"]
    fail(h, "s0")
    (ev,) = [e for e in h.events("failover") if e["app"] == "R"]
    assert (ev["kind"], ev["server"]) == ("warm", "s2")  # not "promoted": it returns home later
    assert h.state.apps["R"].route == Placement("s2", "big")
    assert ("R", "s2") not in h.state.warm  # it is the route now, no longer a replica


def test_autoscaling_scales_out_after_the_upscale_delay_and_in_after_the_downscale_delay():
    scaling = Autoscaling(1, 3, target_ongoing_requests=2, upscale_delay_s=0.5, downscale_delay_s=2.0)
    h = Harness(with_r(1, scaling))
    assert not [c for c in h.of(Load) if c.app == "R"]  # min_replicas 1: the route alone
    t = 1.0
    while t < 1.45:  # 5 ongoing: ceil(5 / 2) = 3 wanted, not for long enough yet
        h.take(h.core.observe_ongoing("R", 5, t))
        t = round(t + 0.1, 6)
    assert not h.events("scale")
    h.take(h.core.observe_ongoing("R", 5, 1.5))
    (ev,) = h.events("scale")
    assert (ev["app"], ev["replicas"], ev["previous"], ev["reason"]) == ("R", 3, 1, "autoscale")
    assert sorted(c.server for c in h.of(Load) if c.app == "R") == ["s1", "s2"]
    for load in [c for c in h.loads.values() if c.app == "R"]:
        h.take(h.core.load_done(load.load_id, True, 1.6))
    assert serving(h) == ["s0", "s1", "s2"]
    t = 2.0
    while t < 4.15:  # idle: wanted fewer from 2.1 on (the 1 s look-back still held the burst)
        h.take(h.core.observe_ongoing("R", 0, t))
        t = round(t + 0.1, 6)
    down = h.events("scale")[-1]
    assert (down["replicas"], down["previous"]) == (1, 3)
    assert serving(h) == ["s0"]
    assert not [c for c in h.of(Unload) if c.app == "R"]  # drained first: requests in flight finish
    assert h.state.routes()["R"]["replicas"]["draining"] == ["s1", "s2"]  # the gateway lets them
    h.take(h.core.advance(4.6))
    assert sorted(c.server for c in h.of(Unload) if c.app == "R") == ["s1", "s2"]
    assert h.state.routes()["R"]["replicas"]["draining"] == []


def test_scale_by_hand_and_bad_input():
    h = Harness(with_r(1))
    h.take(h.core.scale("R", 2, 1.0))
    assert h.events("scale")[-1]["reason"] == "requested"
    assert [c.server for c in h.of(Load) if c.app == "R"] == ["s2"]
    with pytest.raises(ValueError, match="replicas must be 1 to 3"):
        h.core.scale("R", 4, 1.0)
    with pytest.raises(Exception, match="no app 'Q'"):
        h.core.observe_ongoing("Q", 1, 1.0)


def test_a_loaded_warm_backup_becomes_the_replica_without_a_load():
    base = with_r(1)
    h = Harness(base.replace(warm=(*base.warm, WarmBackup("R", "big", "s1"))))
    h.take(h.core.scale("R", 2, 1.0))
    assert not [c for c in h.of(Load) if c.app == "R"]
    rec = h.state.warm[("R", "s1")]
    assert rec.backup.pinned and rec.state is BackupState.WARM and serving(h) == ["s0", "s1"]


def test_a_replica_takes_the_room_of_warm_backups_when_no_server_has_any():
    base = with_r(2)
    small = (base.servers[0], Server("s1", "b", 350, 10), Server("s2", "b", 100, 10))
    h = Harness(base.replace(servers=small))  # s1: 250 MB free beside A's backup, s2 too small
    (load,) = [c for c in h.of(Load) if c.app == "R"]
    assert load.server == "s1"
    assert [(u.app, u.server, u.variant) for u in h.of(Unload)] == [("A", "s1", "small")]
    assert ("A", "s1") not in h.state.warm and h.core.warm.dirty  # backups re-planned in what is left


def test_a_resumed_controller_keeps_the_scaled_count_and_the_replicas_servers_still_hold():
    scaling = Autoscaling(1, 3, target_ongoing_requests=1, upscale_delay_s=0.0)
    h = Harness(with_r(1, scaling))
    h.take(h.core.observe_ongoing("R", 3, 1.0))
    for load in [c for c in h.loads.values() if c.app == "R"]:
        h.take(h.core.load_done(load.load_id, True, 1.1))
    assert serving(h) == ["s0", "s1", "s2"]
    docs = h.state.to_docs()
    state = ClusterState(with_r(1, scaling).replace(warm=None))
    core = Orchestrator(state, h.settings, 10.0)
    core.resume(docs, 10.0)
    core.inspected("s0", InspectPurpose.VERIFY, {"models": [["A", "big"], ["B", "big"], ["R", "big"]]}, 10.1)
    core.inspected("s1", InspectPurpose.VERIFY, {"models": [["R", "big"]]}, 10.1)
    out = core.inspected("s2", InspectPurpose.VERIFY, {"models": []}, 10.1)  # lost its replica
    assert core.ready and state.scale["R"] == 3
    assert [p.server for p in state.serving("R")] == ["s0", "s1"]
    (load,) = [c for c in out if isinstance(c, Load) and c.app == "R"]
    assert load.server == "s2"  # the lost one is loaded again


def test_scaling_out_again_while_a_replica_drains_takes_it_back_without_a_load():
    h = Harness(with_r(2))
    h.finish("R", "big", 0.1)
    h.take(h.core.scale("R", 1, 1.0))
    assert h.state.routes()["R"]["replicas"]["draining"] == ["s2"]
    h.take(h.core.scale("R", 2, 1.05))
    assert serving(h) == ["s0", "s2"] and h.state.routes()["R"]["replicas"]["draining"] == []
    h.take(h.core.advance(1.5))  # the drain timer finds the model needed again
    assert not [c for c in h.of(Unload) if c.app == "R"]
    assert len([c for c in h.of(Load) if c.app == "R"]) == 1
