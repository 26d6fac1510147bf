"""The orchestration core on its own: inputs with explicit times in, commands out.

The cluster: ``s0`` serves apps A (critical), B and C on ``big``; A has a warm ``small`` backup on
``s1``; ``s2`` is empty. Loads are finished by hand, so every step of a failover, its order and its
timing is checked exactly.
"""

from __future__ import annotations

import pytest

from failsoft.domain import (
    App,
    BackupState,
    Family,
    Placement,
    PolicyParams,
    Scenario,
    Server,
    ServerState,
    Variant,
    WarmBackup,
)
from failsoft.orchestration import (
    ClusterState,
    Emit,
    Inspect,
    InspectPurpose,
    Load,
    OrchestrationSettings,
    Orchestrator,
    PlanFailover,
    Planned,
    PlanProactive,
    Priority,
    Publish,
    Unload,
)
from failsoft.policies.registry import get_failover_policy

SMALL = Variant("small", 100, 0.70, 200, 5)
BIG = Variant("big", 300, 0.80, 1000, 10)
HB = 0.020  # heartbeat interval


def cluster(s1_mb: float = 400, s2_mb: float = 450, warm: bool = True) -> Scenario:
    servers = (Server("s0", "a", 1000, 10), Server("s1", "b", s1_mb, 10), Server("s2", "b", s2_mb, 10))
    apps = tuple(App(n, "fam", Placement("s0", "big"), n == "A", 1.0, 100.0) for n in "ABC")
    backups = (WarmBackup("A", "small", "s1"),) if warm else ()
    return Scenario(servers, (Family("fam", (SMALL, BIG)),), apps, PolicyParams(), backups)


class Harness:
    """Feeds the core and keeps what it asked for; plans with the real faillite policy."""

    def __init__(self, scenario: Scenario, policy: str = "faillite", **settings: object) -> None:
        base = {"replan_warm": False, "reconcile_s": None, "gc_s": None, "load_slots": 1, "drain_s": 0.2}
        self.settings = OrchestrationSettings(**(base | settings))  # type: ignore[arg-type]
        self.state = ClusterState.deployed(scenario)
        self.core = Orchestrator(self.state, self.settings, 0.0)
        self.policy = get_failover_policy(policy)
        self.commands: list[object] = []
        self.loads: dict[int, Load] = {}
        self.take(self.core.assume_deployed(0.0))

    def take(self, commands: list[object]) -> list[object]:
        self.commands += commands
        for c in commands:
            if isinstance(c, Load):
                self.loads[c.load_id] = c
        return commands

    def beat_until(self, t_end: float, silent: tuple[str, ...] = (), silent_from: float = 0.0) -> None:
        """Every server heartbeats every 20 ms up to ``t_end``; ``silent`` ones stop at ``silent_from``."""
        k = 0
        while k * HB <= t_end + 1e-9:
            t = k * HB
            for server in self.state.servers:
                if server not in silent or t < silent_from:
                    self.take(self.core.heartbeat(server, t))
            k += 1

    def check(self, t: float) -> list[object]:
        return self.take(self.core.check_health(t))

    def plan(self, t: float) -> list[object]:
        (request,) = [c for c in self.commands if isinstance(c, PlanFailover)][-1:]
        plan = self.policy.plan_failover(request.scenario, request.failed)
        return self.take(self.core.failover_planned(request.plan_id, plan, t))

    def finish(self, app: str, variant: str, t: float, ok: bool = True) -> list[object]:
        (load,) = [c for c in self.loads.values() if c.app == app and c.variant == variant]
        del self.loads[load.load_id]
        return self.take(self.core.load_done(load.load_id, ok, t, info={"load_ms": 1.0}))

    def of(self, kind: type, commands: list[object] | None = None) -> list:
        return [c for c in (self.commands if commands is None else commands) if isinstance(c, kind)]

    def events(self, event_type: str) -> list[dict]:
        return [c.fields for c in self.of(Emit) if c.type == event_type]

    def fail_s0(self, at: float = 0.105) -> list[object]:
        """s0 goes silent after its heartbeat at 0.06; checks every 5 ms until one declares it failed."""
        self.beat_until(at, silent=("s0",), silent_from=0.07)
        out: list[object] = []
        t = 0.0025  # checks half-way between heartbeats, as the simulator's fixed phases do
        while t <= at + 1e-9:
            out += self.check(t)
            t = round(t + 0.005, 6)
        return out


def test_a_crash_switches_warm_apps_at_once_and_asks_for_one_plan_for_the_rest():
    h = Harness(cluster())
    out = h.fail_s0()
    assert h.core.state.servers["s0"].state.value == "failed"
    detected = h.events("detected")[0]["detected_at"]
    assert detected == pytest.approx(0.1025)  # the first check more than 2 x 20 ms after 0.06
    assert {e["app"] for e in h.events("failure")} == {"A", "B", "C"}
    (failover,) = h.events("failover")
    assert failover | {"route_ms": 0.0} == failover and failover["kind"] == "warm"
    assert (failover["app"], failover["server"], failover["variant"]) == ("A", "s1", "small")
    assert h.state.apps["A"].route == Placement("s1", "small")
    (request,) = h.of(PlanFailover, out)
    assert request.failed == ("s0",) and {
        a.name for a in request.scenario.apps if a.primary.server == "s0"
    } == {
        "B",
        "C",
    }
    assert h.of(Publish, out)  # the gateway learns the warm route in the same step


def test_a_plan_is_carried_out_by_priority_then_the_upgrade_waits_for_the_whole_failover():
    h = Harness(cluster())
    h.fail_s0()
    out = h.plan(0.11)
    (planned,) = h.of(Planned, out)
    actions = {a.app: a for a in planned.applied}
    assert (actions["B"].first_variant, actions["B"].final_variant, actions["B"].server) == (
        "small",
        "big",
        "s2",
    )
    assert actions["C"].first_variant == actions["C"].final_variant == "big"
    started = {(c.app, c.server, c.variant, c.priority) for c in h.of(Load, out)}
    assert started == {("B", "s2", "small", Priority.FAILOVER), ("C", "s1", "big", Priority.FAILOVER)}
    out = h.finish("B", "small", 0.31)
    assert h.state.apps["B"].route == Placement("s2", "small")
    failover = h.events("failover")[-1]
    detected = h.events("detected")[0]["detected_at"]
    assert failover["app"] == "B" and failover["route_ms"] == pytest.approx((0.31 - detected) * 1000)
    assert not h.of(Load, out)  # B's upgrade waits: C is not served yet
    out = h.finish("C", "big", 1.11)
    (upgrade,) = h.of(Load, out)
    assert (upgrade.app, upgrade.variant, upgrade.priority, upgrade.background) == (
        "B",
        "big",
        Priority.UPGRADE,
        True,
    )
    out = h.finish("B", "big", 2.11)
    assert h.state.apps["B"].route == Placement("s2", "big") and h.state.apps["B"].final is None
    assert h.events("upgrade")[-1]["previous_variant"] == "small"
    assert not h.of(Unload, out)  # the small one drains first
    assert h.core.next_wakeup() == pytest.approx(2.31)
    out = h.take(h.core.advance(2.31))
    assert [(u.server, u.app, u.variant) for u in h.of(Unload, out)] == [("s2", "B", "small")]
    assert h.core.idle


def test_a_server_with_one_load_slot_starts_critical_loads_first():
    # no warm backup: A (critical) and B, C (not) all go to s2 as cold loads of full-cold
    h = Harness(cluster(s1_mb=50, s2_mb=1000, warm=False), policy="full-cold")
    h.fail_s0()
    out = h.plan(0.11)
    (first,) = h.of(Load, out)  # one slot: one load at a time
    assert first.app == "A" and first.priority is Priority.CRITICAL
    out = h.finish("A", "big", 1.11)
    (second,) = h.of(Load, out)
    assert second.app in {"B", "C"} and second.priority is Priority.FAILOVER


def test_a_death_notice_that_arrives_before_the_plan_runs_joins_it_and_the_loads_go_shortest_first():
    # s0 (B: a long load) and s3 (D: a short one) die 3 ms apart; the survivor s2 has one load slot
    servers = (Server("s0", "a", 1000, 10), Server("s2", "b", 2000, 10), Server("s3", "c", 1000, 10))
    apps = (
        App("B", "fam", Placement("s0", "big"), False, 1.0, 100.0),
        App("D", "fam", Placement("s3", "small"), False, 1.0, 100.0),
    )
    h = Harness(
        Scenario(servers, (Family("fam", (SMALL, BIG)),), apps, PolicyParams(), ()), policy="full-cold"
    )
    h.beat_until(0.06)
    (asked,) = h.of(PlanFailover, h.take(h.core.died("s0", None, 0.070, "process")))
    assert asked.failed == ("s0",)
    assert not h.of(PlanFailover, h.take(h.core.died("s3", None, 0.073, "process")))  # one plan at a time
    # the driver starts the policy (the controller's loop was busy meanwhile): s3 joins the plan
    joined = h.core.failover_plan_starting(asked.plan_id)
    assert joined is not None and joined.plan_id == asked.plan_id and joined.failed == ("s0", "s3")
    assert h.core.failover_plan_starting(asked.plan_id) is None  # nothing new since
    plan = h.policy.plan_failover(joined.scenario, joined.failed)
    out = h.take(h.core.failover_planned(joined.plan_id, plan, 0.090))
    (first,) = h.of(Load, out)
    assert (first.app, first.variant) == ("D", "small")  # the shorter load first, of either server's apps
    assert not h.of(PlanFailover, out)  # both planned: no second plan
    failed_at = {e["app"]: e["detected_at"] for e in h.events("failure")}
    out = h.finish("D", "small", 0.300)
    assert h.events("failover")[-1]["route_ms"] == pytest.approx((0.300 - failed_at["D"]) * 1000)
    (second,) = h.of(Load, out)
    assert (second.app, second.variant) == ("B", "big")


def test_a_plan_asked_with_nothing_new_since_runs_as_asked():
    h = Harness(cluster())
    h.fail_s0()
    (asked,) = h.of(PlanFailover)
    assert h.core.failover_plan_starting(asked.plan_id) is None
    assert h.core.failover_plan_starting(asked.plan_id + 7) is None  # not the plan under way


def test_a_failure_of_the_target_cancels_the_operation_and_its_late_load_is_ignored():
    h = Harness(cluster())
    h.fail_s0()
    h.plan(0.11)
    # s2 (B's target) dies while B loads; C keeps loading on s1
    h.beat_until(0.5, silent=("s0", "s2"), silent_from=0.07)
    out = []
    for k in range(0, 100):
        out += h.check(0.11 + k * 0.005)
    assert "B" not in h.core.operations and h.state.apps["B"].route is None
    out = h.finish("B", "small", 0.7)  # the dead server's load answers late: nothing happens
    assert not h.of(Publish, out) and h.state.apps["B"].route is None
    assert h.state.servers["s2"].holdings == set()


def test_correlated_failures_are_planned_together():
    # s0 holds the primaries, s1 A's backup: a plan for s0 alone would switch A to a dead backup
    h = Harness(cluster())
    h.beat_until(0.3, silent=("s0", "s1"), silent_from=0.07)  # both stop at once
    checks = [h.check(round(0.1 + k * 0.005, 6)) for k in range(40)]
    requests = h.of(PlanFailover, [c for out in checks for c in out])
    assert len(requests) == 1 and set(requests[0].failed) == {"s0", "s1"}
    assert not h.events("failover")  # A's only backup is gone with s1


def test_a_failed_load_backs_off_and_is_planned_again_only_after():
    h = Harness(cluster())
    h.fail_s0()
    h.plan(0.11)
    out = h.finish("B", "small", 0.31, ok=False)
    assert h.state.apps["B"].route is None and not h.of(PlanFailover, out)
    assert h.core.next_wakeup() == pytest.approx(0.31 + 0.5)
    assert not h.of(PlanFailover, h.take(h.core.advance(0.6)))
    out = h.take(h.core.advance(0.81))
    (again,) = h.of(PlanFailover, out)
    assert {a.name for a in again.scenario.apps if a.primary.server == "s0"} == {"B"}


def test_an_app_no_plan_can_place_is_not_planned_in_a_loop():
    h = Harness(cluster(s1_mb=100, s2_mb=50, warm=True))  # no room anywhere for B and C
    h.fail_s0()
    h.plan(0.11)
    assert {e["app"] for e in h.events("unrecovered")} == {"B", "C"}
    for t in (0.2, 0.5, 5.0):
        assert not h.of(PlanFailover, h.take(h.core.advance(t)))


def test_a_returning_server_is_cleaned_and_its_apps_go_home():
    h = Harness(cluster())
    h.fail_s0()
    h.plan(0.11)
    h.finish("B", "small", 0.31)
    h.finish("C", "big", 1.11)
    h.finish("B", "big", 2.11)
    h.take(h.core.advance(2.31))
    out = h.take(h.core.heartbeat("s0", 3.0))  # back, with what it kept: B's big (the rest lost)
    (inspect,) = h.of(Inspect, out)
    assert inspect.purpose is InspectPurpose.RESTORE
    report = {"models": [["B", "big"], ["X", "v"]], "incarnation": None}
    out = h.take(h.core.inspected("s0", InspectPurpose.RESTORE, report, 3.01))
    assert [(u.app, u.variant) for u in h.of(Unload, out)] == [("X", "v")]
    assert h.events("server_up")[-1]["server"] == "s0"
    homes = {(c.app, c.priority) for c in h.of(Load, out)}
    assert homes == {("A", Priority.PRIMARY)}  # one slot: the others queue
    out = h.finish("A", "big", 4.0)
    restore = h.events("restore")[-1]
    assert (restore["app"], restore["previous"]) == ("A", {"server": "s1", "variant": "small"})
    assert h.state.apps["A"].route == Placement("s0", "big")


def test_deploy_waits_for_every_server_then_loads_primaries_then_warm_backups_then_is_ready():
    scenario = cluster().replace(warm=None)
    state = ClusterState(scenario)
    settings = OrchestrationSettings(reconcile_s=None, gc_s=None, load_slots=2)
    core = Orchestrator(state, settings, 0.0)
    assert core.deploy(0.0) == []
    core.heartbeat("s0", 0.0)
    core.heartbeat("s1", 0.0)
    assert core.advance(0.01) == []  # s2 has not spoken
    core.heartbeat("s2", 0.02)
    out = core.advance(0.02)
    loads = [c for c in out if isinstance(c, Load)]
    assert {(c.app, c.priority) for c in loads} == {("A", Priority.PRIMARY), ("B", Priority.PRIMARY)}
    assert not [c for c in out if isinstance(c, Emit) and c.type == "restore"]  # deploying is quiet
    out = core.load_done(loads[0].load_id, True, 0.5)
    out += core.load_done(loads[1].load_id, True, 0.5)
    (c_load,) = [c for c in out if isinstance(c, Load)]
    out = core.load_done(c_load.load_id, True, 1.0)
    (proactive,) = [c for c in out if isinstance(c, PlanProactive)]
    assert not core.ready
    plan = get_failover_policy("faillite").plan_proactive(proactive.scenario)
    out = core.proactive_planned(proactive.plan_id, plan, 1.1)
    warm = [c for c in out if isinstance(c, Load)]
    assert warm and all(c.priority is Priority.WARM for c in warm)
    for c in warm:
        out = core.load_done(c.load_id, True, 1.5)
    assert core.ready and [c for c in out if isinstance(c, Emit) and c.type == "ready"]
    assert all(w.state is BackupState.WARM for w in state.warm.values())


def test_a_server_that_never_spoke_by_the_deploy_deadline_fails_as_not_started_not_as_a_silence():
    # a busy host once started two agents later than the deploy waited (180 s at load 65-97): their
    # failure events read like a crash (no cause, a heartbeat an hour old), and counted as false ones
    scenario = cluster().replace(warm=None)
    state = ClusterState(scenario)
    core = Orchestrator(state, OrchestrationSettings(reconcile_s=None, gc_s=None, deploy_wait_s=1.0), 0.0)
    core.deploy(0.0)
    core.heartbeat("s0", 0.0)
    core.heartbeat("s1", 0.0)
    out = core.advance(1.0)  # s2 never spoke: deployed around
    out += core.check_health(1.01)
    (failure,) = [
        c for c in out if isinstance(c, Emit) and c.type == "failure" and c.fields["server"] == "s2"
    ]
    assert failure.fields["cause"] == "not_started" and failure.fields["last_heartbeat_at"] is None
    assert state.servers["s2"].state is ServerState.FAILED


def test_a_resumed_controller_trusts_what_servers_report():
    h = Harness(cluster())
    docs = h.state.to_docs()
    state = ClusterState(cluster().replace(warm=None))
    core = Orchestrator(state, h.settings, 10.0)
    out = core.resume(docs, 10.0)
    assert {c.server for c in out if isinstance(c, Inspect)} == {"s0", "s1", "s2"}
    assert not core.ready
    core.inspected("s0", InspectPurpose.VERIFY, {"models": [["A", "big"], ["B", "big"]]}, 10.1)
    core.inspected("s1", InspectPurpose.VERIFY, {"models": []}, 10.1)  # lost A's backup
    out = core.inspected("s2", InspectPurpose.VERIFY, {"models": []}, 10.1)
    assert core.ready and next(c for c in out if isinstance(c, Emit) and c.type == "ready").fields["resumed"]
    assert state.apps["C"].route is None and state.apps["A"].route == Placement("s0", "big")
    assert state.warm == {}


def test_garbage_collection_never_overlaps_and_repairs_what_a_server_lost():
    h = Harness(cluster(), gc_s=2.0)  # the first round starts with the core
    assert {c.server for c in h.of(Inspect)} == {"s0", "s1", "s2"}
    assert not h.of(Inspect, h.take(h.core.advance(2.5)))  # the last round has not answered
    held = {"models": [["A", "small"], ["Z", "v"], ["A~slo", "small"]]}  # A~slo: an old gateway's
    h.take(h.core.inspected("s1", InspectPurpose.GC, held, 2.6))
    h.take(h.core.inspected("s2", InspectPurpose.GC, {"models": []}, 2.6))
    out = h.take(h.core.inspected("s0", InspectPurpose.GC, {"models": [["A", "big"], ["B", "big"]]}, 2.6))
    assert [(u.server, u.app) for u in h.of(Unload)] == [("s1", "A~slo"), ("s1", "Z")]
    (repair,) = h.of(Load, out)
    assert (repair.app, repair.server, repair.priority) == ("C", "s0", Priority.FAILOVER)
    assert len(h.of(Inspect, out)) == 3  # the overdue round starts the moment the last one ended


def test_pinned_backups_survive_a_warm_replan():
    scenario = cluster().replace(
        warm=(WarmBackup("A", "small", "s1"), WarmBackup("B", "small", "s2", pinned=True))
    )
    h = Harness(scenario, replan_warm=True, replan_delay_s=0.0)
    h.core.warm.dirty = True
    out = h.take(h.core.advance(1.0))
    (proactive,) = h.of(PlanProactive, out)
    assert all(s.memory_mb < 450 for s in proactive.scenario.servers if s.name == "s2")  # pinned held
    plan = h.policy.plan_proactive(proactive.scenario)
    h.take(h.core.proactive_planned(proactive.plan_id, plan, 1.1))
    assert ("B", "s2") in h.state.warm and h.state.warm[("B", "s2")].backup.pinned
    assert not [u for u in h.of(Unload) if u.app == "B"]


def test_a_server_that_heartbeats_but_does_not_serve_is_failed_over_and_kept_out_a_while():
    h = Harness(cluster(), quarantine_s=10.0)
    h.beat_until(0.1)
    out = h.take(h.core.unhealthy("s0", 0.1, "10 inference calls in a row failed"))
    assert h.state.servers["s0"].state.value == "failed"
    (unhealthy,) = h.events("unhealthy")
    assert unhealthy["server"] == "s0" and "in a row" in unhealthy["reason"]
    assert {e["app"] for e in h.events("failure")} == {"A", "B", "C"}
    assert h.state.apps["A"].route == Placement("s1", "small")  # the warm switch, as after a crash
    (request,) = h.of(PlanFailover, out)
    assert request.failed == ("s0",)
    assert h.core.unhealthy("s0", 0.2, "again") == []  # already failed: nothing more
    assert h.core.unhealthy("nosuch", 0.2, "?") == []
    # It keeps heartbeating: ignored during the quarantine (no restore, no apps sent back) ...
    h.commands.clear()
    for k in range(1, 50):
        h.take(h.core.heartbeat("s0", 0.1 + k * 0.2))
        h.check(0.1 + k * 0.2 + 0.001)
    assert not h.of(Inspect) and h.state.servers["s0"].state.value == "failed"
    # ... and after it, it recovers as any failed server does: inspected, then restored.
    out = h.take(h.core.heartbeat("s0", 10.2))
    (inspect,) = h.of(Inspect, out)
    assert inspect.purpose is InspectPurpose.RESTORE


def test_a_restart_lifts_the_quarantine():
    h = Harness(cluster(), quarantine_s=60.0)
    h.take(h.core.heartbeat("s0", 0.0, incarnation="one"))
    h.take(h.core.unhealthy("s0", 0.1, "broken"))
    h.take(h.core.heartbeat("s0", 0.2, incarnation="one"))
    h.check(0.21)
    assert not h.of(Inspect)
    h.take(h.core.heartbeat("s0", 0.5, incarnation="two"))  # a fresh process
    for k in range(1, 6):
        h.take(h.core.heartbeat("s0", 0.5 + k * HB, incarnation="two"))
        h.check(0.5 + k * HB + 0.001)
    assert [c.purpose for c in h.of(Inspect)] == [InspectPurpose.RESTORE]


def test_proof_of_death_fails_the_server_now_and_says_so():
    """The gateway's connection ended (or the sidecar saw the process die): failed at once, even
    while another server is merely suspect, and the failure events name the cause."""
    h = Harness(cluster(), link_grace_s=0.25)
    h.take(h.core.heartbeat("s0", 0.0, incarnation="one"))
    h.beat_until(0.1)
    assert h.core.died("s0", "old", 0.1, "connection") == []  # another process's connection
    assert h.core.link("s0", "one", 0.1) == [] and h.core.detector.linked("s0")
    h.beat_until(0.3, silent=("s1",), silent_from=0.11)  # s1 is late: suspect, which must not delay s0
    h.check(0.125)
    out = h.take(h.core.died("s0", "one", 0.13, "connection"))
    assert h.state.servers["s0"].state.value == "failed"
    failures = h.events("failure")
    assert {e["app"] for e in failures} == {"A", "B", "C"}
    assert all(e["cause"] == "connection" and e["detected_at"] == 0.13 for e in failures)
    assert h.state.apps["A"].route == Placement("s1", "small")  # the warm switch in the same step
    assert h.of(PlanFailover, out)
    assert h.core.died("s0", "one", 0.2, "process") == []  # already failed: nothing more


def test_a_late_heartbeat_over_a_live_connection_is_no_failure():
    h = Harness(cluster(), link_grace_s=0.25)
    h.take(h.core.heartbeat("s0", 0.0, incarnation="one"))
    h.take(h.core.link("s0", "one", 0.0))
    h.beat_until(0.3, silent=("s0",), silent_from=0.1)  # s0's heartbeats stop for 0.2 s ...
    t = 0.0025
    while t <= 0.3:
        h.check(t)
        t = round(t + 0.005, 6)
    h.take(h.core.heartbeat("s0", 0.3, incarnation="one"))  # ... and come back: it was late
    h.check(0.3025)
    assert h.state.servers["s0"].state.value == "up" and not h.events("failure")


def test_heartbeat_failures_have_no_cause_field():
    h = Harness(cluster())
    h.fail_s0()
    assert h.events("failure") and all("cause" not in e for e in h.events("failure"))


def test_a_plans_loads_are_sent_shortest_first_so_the_free_slot_goes_to_the_shortest():
    from failsoft.domain import ActionKind, FailoverAction, FailoverPlan

    h = Harness(cluster(s2_mb=1000))  # one load slot per server
    h.fail_s0()
    (request,) = h.of(PlanFailover)
    plan = FailoverPlan(  # the plan lists C's long cold load before B's short progressive one
        "hand",
        request.failed,
        (
            FailoverAction("C", ActionKind.COLD, "s2", "big", "big"),
            FailoverAction("B", ActionKind.PROGRESSIVE, "s2", "small", "big"),
        ),
        (),
        0.0,
    )
    out = h.take(h.core.failover_planned(request.plan_id, plan, 0.11))
    (first,) = h.of(Load, out)
    assert (first.app, first.variant) == ("B", "small")  # 200 ms before 1000 ms
    (second,) = h.of(Load, h.finish("B", "small", 0.31))
    assert (second.app, second.variant) == ("C", "big")


def test_a_heavy_slot_holds_a_second_heavy_load_while_a_small_one_passes():
    from failsoft.domain import ActionKind, FailoverAction, FailoverPlan

    h = Harness(cluster(s2_mb=1000), load_slots=2, heavy_load_slots=1)  # every variant here is heavy
    h.fail_s0()
    (request,) = h.of(PlanFailover)
    actions = (
        FailoverAction("C", ActionKind.COLD, "s2", "big", "big"),
        FailoverAction("B", ActionKind.COLD, "s2", "small", "small"),
    )
    out = h.take(
        h.core.failover_planned(request.plan_id, FailoverPlan("hand", request.failed, actions, (), 0.0), 0.11)
    )
    assert [(c.app, c.variant) for c in h.of(Load, out)] == [("B", "small")]  # C waits for the heavy slot
    assert [(c.app, c.variant) for c in h.of(Load, h.finish("B", "small", 0.31))] == [("C", "big")]
