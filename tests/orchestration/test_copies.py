"""Mechanism copies (pinned): asked of the core, loaded, counted, published, dropped, promoted.

The cluster of :mod:`tests.orchestration.test_core`: ``s0`` (1000 MB) serves A, B and C on ``big``
(300 MB each); A has a warm ``small`` (100 MB) backup on ``s1`` (400 MB); ``s2`` (450 MB) is empty.
"""

from __future__ import annotations

import pytest

from failsoft.domain import BackupState, Placement, ProactivePlan, WarmBackup
from failsoft.errors import CapacityError, UnknownNameError
from failsoft.orchestration import CopyRequest, Load, PlanProactive, Priority, Publish, Unload
from tests.orchestration.test_core import Harness, cluster

OWNER = "graph:g"


def pin(h: Harness, app: str, variant: str, server: str | None, owner: str, now: float, *args, **kw):
    return h.core.pin(CopyRequest(app, variant, owner, server, *args, **kw), now)


def pinned(h: Harness, app: str) -> list[dict]:
    return h.state.routes()[app]["pinned"]


def test_a_pin_is_a_load_at_its_priority_published_and_ready_once_loaded():
    h = Harness(cluster())
    server, out = pin(h, "B", "small", "s2", OWNER, 1.0, Priority.FAILOVER)
    h.take(out)
    (load,) = h.of(Load, out)
    assert (server, load.server, load.app, load.variant, load.priority) == (
        "s2", "s2", "B", "small", Priority.FAILOVER,
    )  # fmt: skip
    assert h.of(Publish, out)
    assert pinned(h, "B") == [{"server": "s2", "variant": "small", "owner": OWNER, "ready": False}]
    out = h.finish("B", "small", 1.2)
    assert pinned(h, "B")[0]["ready"] and h.of(Publish, out)
    assert h.state.warm[("B", "s2")].backup == WarmBackup("B", "small", "s2", pinned=True)
    assert h.state.to_docs()["warm"]["B@s2"]["owner"] == OWNER  # the store keeps it
    # the status tells a pinned copy from a warm backup (bench fidelity's twin starts from it)
    (b,) = (a for a in h.state.status()["apps"] if a["name"] == "B")
    assert b["warm_backups"] == [{"server": "s2", "variant": "small", "state": "warm", "pinned": True}]


def test_a_pin_counts_against_memory_and_is_refused_when_it_does_not_fit():
    h = Harness(cluster())
    h.take(pin(h, "B", "big", "s2", OWNER, 1.0)[1])
    assert h.state.used_mb("s2") == 300
    with pytest.raises(CapacityError, match="s2"):
        pin(h, "C", "big", "s2", OWNER, 1.1)  # 600 of 450 MB
    assert ("C", "s2") not in h.state.warm and not [c for c in h.of(Load) if c.app == "C"]
    with pytest.raises(UnknownNameError, match="huge"):
        pin(h, "C", "huge", "s2", OWNER, 1.1)
    h.finish("B", "big", 1.5)
    less = h.state.snapshot(with_warm=False)  # what warm-backup planning sees
    assert next(s for s in less.servers if s.name == "s2").memory_mb == 150


def test_placement_picks_the_roomiest_server_away_from_the_primary_and_its_site():
    h = Harness(cluster())
    server, _ = pin(h, "B", "small", None, OWNER, 1.0, avoid=("s0",))
    assert server == "s2"  # 450 MB free against s1's 300
    with pytest.raises(CapacityError, match="sites"):  # s1 and s2 are both at site b
        pin(h, "C", "small", None, OWNER, 1.0, avoid=("s0",), avoid_sites=("b",))


def test_pinned_copies_survive_a_warm_replan_that_wants_none():
    h = Harness(cluster(), replan_warm=True, replan_delay_s=0.0)
    h.take(pin(h, "B", "small", "s2", OWNER, 1.0)[1])
    h.finish("B", "small", 1.1)
    h.core.warm.dirty = True
    (proactive,) = h.of(PlanProactive, h.take(h.core.advance(2.0)))
    plan = ProactivePlan("none", (), (), 0.0, 0.0)
    h.take(h.core.proactive_planned(proactive.plan_id, plan, 2.1))
    assert h.state.warm[("B", "s2")].state is BackupState.WARM
    assert [(u.app, u.server) for u in h.of(Unload)] == [("A", "s1")]  # the unpinned one went


def test_unpin_unloads_after_the_drain_and_a_replacing_pin_keeps_the_old_copy_until_ready():
    h = Harness(cluster())
    h.take(pin(h, "B", "small", "s2", OWNER, 1.0)[1])
    h.finish("B", "small", 1.1)
    h.take(pin(h, "B", "big", "s2", OWNER, 2.0)[1])  # another rung, same server
    assert h.state.needed_on("s2") == {("B", "small"), ("B", "big")}
    assert not h.of(Unload, h.take(h.core.advance(3.0)))  # the old copy serves until the new is warm
    h.finish("B", "big", 3.1)
    assert not h.of(Unload, h.take(h.core.advance(3.2)))  # drained first
    (unload,) = h.of(Unload, h.take(h.core.advance(3.31)))
    assert (unload.server, unload.app, unload.variant) == ("s2", "B", "small")
    h.take(h.core.unpin("B", "s2", "slo:other", 4.0))
    assert ("B", "s2") in h.state.warm  # another owner cannot take it away
    h.take(h.core.unpin("B", "s2", OWNER, 4.0))
    assert pinned(h, "B") == []
    (unload,) = h.of(Unload, h.take(h.core.advance(4.21)))
    assert (unload.server, unload.variant) == ("s2", "big")


def test_a_failed_servers_pinned_copies_are_dropped_and_the_table_says_so():
    h = Harness(cluster())
    h.take(pin(h, "C", "small", "s0", "slo:s", 0.01)[1])  # a Jellyfish rung beside C's route
    h.finish("C", "small", 0.02)
    assert pinned(h, "C")[0]["ready"]
    out = h.fail_s0()
    assert pinned(h, "C") == [] and ("C", "s0") not in h.state.warm and h.of(Publish, out)
    assert h.state.apps["C"].route is None  # a copy on the failed server takes over nothing


def test_a_crash_promotes_the_warm_pinned_copy_and_the_app_stays_there():
    h = Harness(cluster())
    h.take(pin(h, "B", "big", None, OWNER, 0.01, avoid=("s0",))[1])
    h.finish("B", "big", 0.02)
    h.fail_s0()
    rec = h.state.apps["B"]
    assert rec.route == Placement("s2", "big") and rec.kind.value == "promoted"
    assert {e["app"]: e["kind"] for e in h.events("failover")} == {"A": "warm", "B": "promoted"}
    assert ("B", "s2") not in h.state.warm  # the copy is the route now, no longer a backup
    assert h.state.routes()["B"]["route"]["kind"] == "promoted"
    h.core.fx.attention.add("B")
    h.state.servers["s0"].state = h.state.servers["s1"].state  # s0 back up
    out = h.take(h.core.advance(5.0))
    assert not [c for c in h.of(Load, out) if c.app == "B"]  # no return home: the state is here
