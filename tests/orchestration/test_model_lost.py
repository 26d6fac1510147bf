"""A primary that loses its model while its server lives: the core promotes the pinned copy, as for a crash.

The cluster of :mod:`tests.orchestration.test_core` (``s0`` serves A, B and C on ``big``; A has a
warm ``small`` backup on ``s1``; ``s2`` is empty), with B a HAMS stateful node: its backup is a
copy pinned by ``graph:g`` away from ``s0``. The loss reaches the core as an input
(:meth:`Orchestrator.model_lost`, from the gateway's call or an inspection), or as a restarted agent
(a new incarnation: the server held nothing any more, so it is failed like a crash).
"""

from __future__ import annotations

from failsoft.domain import Placement, ServerState
from failsoft.orchestration import CopyRequest, Inspect, InspectPurpose, Load, PlanFailover, Publish
from tests.orchestration.test_core import HB, Harness, cluster

OWNER = "graph:g"


def with_backup(**settings: object) -> Harness:
    """B's backup pinned on the roomiest server away from s0 (s2) and warm."""
    h = Harness(cluster(), **settings)
    server, out = h.core.pin(CopyRequest("B", "big", OWNER, avoid=("s0",)), 0.01)
    h.take(out)
    assert server == "s2"
    h.finish("B", "big", 0.02)
    return h


def test_a_lost_primary_model_promotes_the_pinned_copy_at_once_and_a_new_backup_can_be_placed():
    h = with_backup()
    out = h.take(h.core.model_lost("B", "s0", "big", 1.0, "call"))
    rec = h.state.apps["B"]
    assert rec.route == Placement("s2", "big") and rec.kind.value == "promoted"
    assert h.state.routes()["B"]["route"]["kind"] == "promoted" and h.of(Publish, out)
    assert ("B", "s2") not in h.state.warm  # the copy is the route now, no longer a backup
    assert h.state.servers["s0"].state is ServerState.UP  # only the copy failed, not its server
    assert ("B", "big") not in h.state.servers["s0"].holdings
    (lost,) = h.events("model_lost")
    assert (lost["app"], lost["server"], lost["variant"], lost["cause"]) == ("B", "s0", "big", "call")
    (failover,) = h.events("failover")
    assert (failover["app"], failover["server"], failover["kind"]) == ("B", "s2", "promoted")
    assert failover["route_ms"] == 0.0 and failover["cause"] == "model_lost"
    assert not h.of(Load, out)  # no reload in place: the promoted copy holds the state
    assert h.state.apps["A"].route == h.state.apps["C"].route == Placement("s0", "big")  # untouched
    # the dispatcher's PlaceBackup: away from the new primary and from the server that lost it
    server, out = h.core.pin(CopyRequest("B", "big", OWNER, avoid=("s2", "s0")), 1.1)
    (load,) = h.of(Load, h.take(out))
    assert server == "s1" and (load.app, load.server) == ("B", "s1")
    # a return home never comes: the state lives on s2
    h.core.fx.attention.add("B")
    assert not [c for c in h.of(Load, h.take(h.core.advance(5.0))) if c.server == "s0"]


def test_a_stale_report_changes_nothing():
    h = with_backup()
    h.take(h.core.model_lost("B", "s0", "big", 1.0, "call"))
    before = (h.state.apps["B"].route, dict(h.state.warm))
    out = h.take(h.core.model_lost("B", "s0", "big", 1.01, "call"))  # a second call's report, late
    assert (h.state.apps["B"].route, dict(h.state.warm)) == before and not h.of(Load, out)
    h.take(h.core.model_lost("A", "s0", "small", 1.02, "call"))  # not A's route's variant
    h.take(h.core.model_lost("C", "s1", "big", 1.03, "call"))  # not C's route's server
    assert len(h.events("model_lost")) == 1 and len(h.events("failover")) == 1


def test_a_lost_model_without_a_copy_elsewhere_is_unrouted_while_it_reloads_in_place():
    """The route goes while the model reloads (the gateway's requests wait for one instead of
    calling a server that refuses them) and comes back as a new route (a newer ``route_at``), which
    the requests that found the loss retry on; the reload is a ``failover`` of kind ``reload``."""
    h = with_backup()
    routed_at = h.state.apps["C"].route_at
    out = h.take(h.core.model_lost("C", "s0", "big", 1.0, "call"))
    (repair,) = h.of(Load, out)
    assert (repair.app, repair.server, repair.variant) == ("C", "s0", "big")
    rec = h.state.apps["C"]
    assert rec.route is None and h.state.routes()["C"]["route"] is None and h.of(Publish, out)
    assert rec.final == Placement("s0", "big")  # its memory there stays reserved meanwhile
    assert h.state.servers["s0"].state is ServerState.UP and len(h.events("model_lost")) == 1
    out = h.take(h.core.model_lost("C", "s0", "big", 1.01, "call"))  # under repair: not again
    assert not h.of(Load, out) and len(h.events("model_lost")) == 1
    assert not h.of(PlanFailover)  # an unrouted app on a live server is no failover to plan
    out = h.finish("C", "big", 1.2)
    assert rec.route == Placement("s0", "big") and rec.kind.value == "primary" and rec.final is None
    assert rec.route_at == 1.2 and routed_at != 1.2 and h.of(Publish, out)
    (reload,) = h.events("failover")
    assert (reload["app"], reload["server"], reload["kind"]) == ("C", "s0", "reload")
    assert reload["cause"] == "model_lost"
    assert reload["route_ms"] == 200.0 and reload["load_ms"] == 1.0


def test_a_failed_reload_leaves_the_app_unrouted_and_backing_off_then_home_again():
    h = with_backup(reconcile_s=0.25)
    h.take(h.core.model_lost("C", "s0", "big", 1.0, "call"))
    h.finish("C", "big", 1.1, ok=False)
    assert h.state.apps["C"].route is None and h.state.apps["C"].final is None
    assert not [c for c in h.of(Load, h.take(h.core.advance(1.2))) if c.app == "C"]  # backing off
    out = h.take(h.core.advance(1.7))  # 0.5 s later: its return home reloads it
    (home,) = [c for c in h.of(Load, out) if c.app == "C"]
    assert (home.server, home.variant) == ("s0", "big")
    h.finish("C", "big", 1.8)
    assert h.state.apps["C"].route == Placement("s0", "big")


def test_a_lost_model_with_a_warm_backup_switches_to_it_at_once_then_returns_home():
    """FailLite's warm backup serves at once, as after a crash (no wait for a reload); the home,
    whose server lives, is reloaded meanwhile and the traffic returns to it."""
    h = with_backup()
    out = h.take(h.core.model_lost("A", "s0", "big", 1.0, "call"))
    rec = h.state.apps["A"]
    assert rec.route == Placement("s1", "small") and rec.kind.value == "warm" and h.of(Publish, out)
    (failover,) = h.events("failover")
    assert (failover["app"], failover["kind"], failover["cause"]) == ("A", "warm", "model_lost")
    assert failover["route_ms"] == 0.0
    (home,) = h.of(Load, out)  # the return home starts at once
    assert (home.app, home.server, home.variant) == ("A", "s0", "big")
    h.finish("A", "big", 1.3)
    assert rec.route == Placement("s0", "big") and rec.kind.value == "primary"
    (restore,) = h.events("restore")
    assert (restore["app"], restore["server"]) == ("A", "s0")


def test_the_periodic_inspection_finds_the_loss_and_promotes_the_same_way():
    h = with_backup(gc_s=2.0)
    for server, held in (("s1", [["A", "small"]]), ("s2", [["B", "big"]])):
        h.take(h.core.inspected(server, InspectPurpose.GC, {"models": held}, 0.5))
    s0 = {"models": [["A", "big"], ["C", "big"]]}  # B's primary is gone, s0 heartbeats on
    h.take(h.core.inspected("s0", InspectPurpose.GC, s0, 0.5))
    assert h.state.apps["B"].route == Placement("s2", "big") and h.state.apps["B"].kind.value == "promoted"
    assert [e["cause"] for e in h.events("model_lost")] == ["inspection"]


def test_an_inspection_older_than_the_route_does_not_call_it_lost():
    h = with_backup(gc_s=2.0)
    h.take(h.core.model_lost("C", "s0", "big", 1.0, "call"))  # reloaded in place ...
    h.finish("C", "big", 1.1)
    h.take(h.core.advance(2.0))  # a new round of inspections at 2.0
    assert {c.server for c in h.of(Inspect)[-3:]} == {"s0", "s1", "s2"}
    h.state.apps["C"].route_at = 2.05  # ... a route published after the round was asked for
    h.take(h.core.inspected("s0", InspectPurpose.GC, {"models": [["A", "big"], ["B", "big"]]}, 2.1))
    assert len(h.events("model_lost")) == 1  # the report may predate the route: not a loss


def test_a_restarted_agent_is_failed_at_once_and_its_stateful_primary_promoted():
    """``agents.restart``: the agent's process died and came back empty (a new incarnation) while
    the server kept heartbeating: its copies and their state are gone, so the server is failed and
    the pinned copy promoted at the next check, as for a crash (no wait for missed heartbeats)."""
    h = with_backup()
    t = 0.0
    while t <= 0.06 + 1e-9:
        for server in ("s0", "s1", "s2"):
            h.take(h.core.heartbeat(server, t, incarnation=f"{server}-1"))
        t = round(t + HB, 6)
    h.take(h.core.heartbeat("s0", 0.07, incarnation="s0-2"))  # restarted between two heartbeats
    h.check(0.0725)
    rec = h.state.apps["B"]
    assert rec.route == Placement("s2", "big") and rec.kind.value == "promoted"
    assert h.state.servers["s0"].state is ServerState.FAILED
    (failover,) = (e for e in h.events("failover") if e["app"] == "B")
    assert failover["kind"] == "promoted"


def replica_and_backup() -> Harness:
    """B scaled to two (its replica on s1, the roomiest: 800 MB there) and its HAMS copy pinned away
    from s0 on s2 (the roomiest left): two warm pinned copies, the replica first by server name."""
    h = Harness(cluster(s1_mb=800))
    h.take(h.core.scale("B", 2, 0.01))
    h.finish("B", "big", 0.02)
    server, out = h.core.pin(CopyRequest("B", "big", OWNER, avoid=("s0",)), 0.03)
    h.take(out)
    h.finish("B", "big", 0.04)
    assert server == "s2" and [w.owner for _, w in sorted(h.state.warm.items()) if w.backup.app == "B"] == [
        "replica",
        OWNER,
    ]
    return h


def test_a_crash_and_a_model_loss_promote_the_same_copy_the_mechanisms_not_the_replica():
    """One lookup (``Orchestrator._pinned_copy``) for both paths: the HAMS copy holds B's state, the
    replica holds only the model, so both promote the HAMS copy on s2, whatever the names' order."""
    lost = replica_and_backup()
    lost.take(lost.core.model_lost("B", "s0", "big", 1.0, "call"))
    crashed = replica_and_backup()
    crashed.fail_s0()
    for h in (lost, crashed):
        rec = h.state.apps["B"]
        assert (rec.route, rec.kind.value) == (Placement("s2", "big"), "promoted")
        assert {e["app"]: e["kind"] for e in h.events("failover")}["B"] == "promoted"
        assert h.state.warm[("B", "s1")].owner == "replica"  # the replica serves on beside it
