"""The deploy planner (pure) and the core carrying a plan out, with explicit times.

The cluster of ``test_core``: ``s0`` (1000 MB) serves A (critical), B and C on ``big`` (300 MB);
A has a warm ``small`` backup on ``s1``; ``s2`` is empty.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server
from failsoft.orchestration import Emit, Load, Unload
from failsoft.orchestration.deploy import (
    DeployRefused,
    Desired,
    Running,
    StepKind,
    apply_plan,
    plan_deploy,
)
from failsoft.services import CodedParams, Service, ServiceMode
from tests.orchestration.test_core import BIG, SMALL, Harness, cluster

POLICY = "faillite"


def desired(scenario: Scenario, policy: str = POLICY, delay: float = 3.0) -> Desired:
    return Desired(scenario.replace(warm=None), policy, delay)


def running(scenario: Scenario) -> Running:
    placed = {a.name: (a.primary,) for a in scenario.apps if a.primary is not None}
    return Running(scenario.replace(warm=None), POLICY, 3.0, placed, tuple(scenario.warm or ()))


def with_apps(scenario: Scenario, *apps: App, drop: tuple[str, ...] = ()) -> Scenario:
    kept = {a.name: a for a in scenario.apps if a.name not in drop}
    kept.update({a.name: a for a in apps})
    return scenario.replace(apps=tuple(kept.values()))


def app(name: str, server: str, variant: str = "big", **kw: object) -> App:
    return App(name, "fam", Placement(server, variant), kw.pop("critical", False), 1.0, 100.0)  # type: ignore[arg-type]


# the planner ---------------------------------------------------------------------------------------
def test_the_same_config_is_an_empty_plan():
    base = cluster()
    plan = plan_deploy(running(base), desired(base))
    assert plan.empty and plan.steps == ()


def test_removals_go_first_then_moves_then_additions():
    base = cluster()
    new = with_apps(base, app("D", "s2"), app("B", "s2", "small"), drop=("C",))
    plan = plan_deploy(running(base), desired(new))
    assert [(s.kind, s.app) for s in plan.steps] == [
        (StepKind.REMOVE, "C"),
        (StepKind.MOVE, "B"),
        (StepKind.ADD, "D"),
    ]
    move = plan.steps[1]
    assert move.old == (Placement("s0", "big"),) and move.new == Placement("s2", "small")
    assert move.servers == {"s0", "s2"}
    assert plan.to_dict()["moved"] == ["B"]


def test_settings_changed_in_place_are_not_steps():
    base = cluster()
    b = dataclasses.replace(base.app("B"), critical=True, rate_rps=3.0)
    plan = plan_deploy(running(base), desired(with_apps(base, b), policy="full-warm", delay=1.0))
    assert plan.steps == () and plan.changed == (b,)
    assert (plan.policy_name, plan.replan_delay_s) == ("full-warm", 1.0)


def test_a_move_that_only_fits_once_another_app_left_waits_for_it():
    # s2 (450 MB) holds E's big (300): B's big fits there only once E has moved to s1
    base = with_apps(cluster(), app("E", "s2"))
    new = with_apps(base, app("B", "s2"), app("E", "s1"))
    plan = plan_deploy(running(base), desired(new))
    assert [s.app for s in plan.steps] == ["E", "B"]


def test_a_config_whose_moves_cannot_fit_in_any_order_is_refused_naming_the_memory():
    base = with_apps(cluster(s2_mb=300), app("E", "s2"))
    new = with_apps(base, app("B", "s2"), app("E", "s1"), app("C", "s2", "small"))
    with pytest.raises(DeployRefused, match=r"memory: app 'C' needs 100 MB .* on server 's2'"):
        plan_deploy(running(base), desired(new))


def test_unpinned_warm_backups_count_as_free_memory():
    base = cluster(s1_mb=400)  # s1 holds A's small backup (100 MB)
    new = with_apps(base, app("B", "s1"), app("C", "s1", "small"))  # 400 MB: only without the backup
    plan = plan_deploy(running(base), desired(new))
    assert {s.app for s in plan.steps} == {"B", "C"}


def test_other_servers_are_refused():
    base = cluster()
    new = base.replace(servers=(*base.servers, Server("s3", "c", 100, 1)))
    with pytest.raises(DeployRefused, match="servers change only with a restart"):
        plan_deploy(running(base), desired(new))


def test_a_member_that_changes_mode_is_refused():
    base = cluster()
    coded = Service("grp", ServiceMode.CODED, ("A", "B", "C"), CodedParams(k=2, r=1))
    with pytest.raises(DeployRefused, match=r"app 'A' changes mode \(single .* coded"):
        plan_deploy(running(base), desired(base.replace(services=(coded,))))


def test_an_app_that_changes_family_is_refused():
    other = Family("other", (SMALL,))
    base = cluster()
    moved = App("B", "other", Placement("s0", "small"))
    new = with_apps(base.replace(families=(*base.families, other)), moved)
    with pytest.raises(DeployRefused, match="app 'B' changes family"):
        plan_deploy(running(base), desired(new))


# properties --------------------------------------------------------------------------------------------
FAM = Family("fam", (SMALL, BIG))
SERVERS = (Server("s0", "a", 5000, 10), Server("s1", "a", 5000, 10), Server("s2", "b", 5000, 10))


@st.composite
def deployments(draw: st.DrawFn) -> Scenario:
    names = draw(st.lists(st.sampled_from("ABCDEFG"), unique=True, max_size=6))
    apps = tuple(
        App(
            n,
            "fam",
            Placement(draw(st.sampled_from(["s0", "s1", "s2"])), draw(st.sampled_from(["small", "big"]))),
            draw(st.booleans()),
            draw(st.sampled_from([1.0, 2.0])),
            100.0,
        )
        for n in names
    )
    return Scenario(SERVERS, (FAM,), apps, PolicyParams(alpha=draw(st.sampled_from([0.1, 0.2]))))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(deployments())
def test_planning_a_deployment_against_itself_is_empty(a):
    assert plan_deploy(running(a), desired(a)).empty


@settings(max_examples=200, deadline=None, derandomize=True)
@given(deployments(), deployments())
def test_applying_the_plan_from_a_to_b_yields_b(a, b):
    plan = plan_deploy(running(a), desired(b))
    assert apply_plan(a, plan) == b.replace(warm=None)
    # and once there, nothing is left to do
    assert plan_deploy(running(b), desired(apply_plan(a, plan))).empty


# the core carrying a plan out ---------------------------------------------------------------------------
def deploy(h: Harness, new: Scenario, t: float) -> list[object]:
    plan, commands = h.core.apply_deploy(desired(new), POLICY, "digest", t)
    assert not plan.empty
    return h.take(commands)


def test_a_move_loads_beside_the_old_switches_then_unloads_the_old_after_the_drain():
    h = Harness(cluster())
    new = with_apps(cluster(), app("B", "s2"))
    out = deploy(h, new, 1.0)
    (load,) = h.of(Load, out)
    assert (load.server, load.app, load.variant, load.background) == ("s2", "B", "big", True)
    assert h.state.apps["B"].route == Placement("s0", "big")  # still served where it was
    h.finish("B", "big", 1.5)
    assert h.state.apps["B"].route == Placement("s2", "big")
    (rollout,) = h.events("rollout")
    assert rollout["previous"] == [{"server": "s0", "variant": "big"}] and rollout["version"] == 2
    assert not h.of(Unload)
    h.take(h.core.advance(1.75))
    assert [(u.server, u.app) for u in h.of(Unload)] == [("s0", "B")]
    done = [e for e in h.events("deploy") if e.get("phase") == "done"]
    assert done and done[0]["rolled_back"] == {}
    assert h.core.deploys.version == 2 and not h.core.deploys.busy


def test_a_move_whose_load_fails_rolls_back_and_keeps_serving_the_old_home():
    h = Harness(cluster())
    deploy(h, with_apps(cluster(), app("B", "s2")), 1.0)
    h.finish("B", "big", 1.2, ok=False)
    rec = h.state.apps["B"]
    assert rec.route == rec.home == Placement("s0", "big")
    assert h.state.deployment.app("B").primary == Placement("s0", "big")
    (rollback,) = h.events("rollback")
    assert rollback["app"] == "B" and rollback["server"] == "s0"
    done = [e for e in h.events("deploy") if e.get("phase") == "done"]
    assert done[0]["rolled_back"].keys() == {"B"}


def test_a_removed_app_keeps_its_route_until_its_drain_then_is_unloaded_and_forgotten():
    h = Harness(cluster())
    deploy(h, with_apps(cluster(), drop=("C",)), 1.0)
    assert h.state.apps["C"].route == Placement("s0", "big")  # requests on their way are answered
    assert "C" not in {a.name for a in h.state.snapshot().apps}
    h.take(h.core.advance(1.0 + h.settings.retire_s))
    assert "C" not in h.state.apps and "C" not in h.state.routes()
    assert [(u.server, u.app, u.variant) for u in h.of(Unload)] == [("s0", "C", "big")]
    assert any(e.get("action") == "removed" for e in h.events("deploy"))


def test_an_added_app_is_loaded_then_routed_and_a_second_identical_deploy_changes_nothing():
    h = Harness(cluster())
    new = with_apps(cluster(), app("D", "s2", "small"))
    deploy(h, new, 1.0)
    assert h.state.apps["D"].route is None
    h.finish("D", "small", 1.3)
    assert h.state.apps["D"].route == Placement("s2", "small")
    assert [e["app"] for e in h.events("deploy") if e.get("action") == "added"] == ["D"]
    plan, commands = h.core.apply_deploy(desired(new), POLICY, "digest", 2.0)
    assert plan.empty and not [c for c in commands if isinstance(c, (Load, Unload, Emit))]
    assert h.core.deploys.version == 2


def test_steps_on_the_same_server_wait_for_each_other():
    h = Harness(cluster())
    new = with_apps(cluster(), app("B", "s2"), app("C", "s2", "small"))
    out = deploy(h, new, 1.0)
    assert [(c.app, c.server) for c in h.of(Load, out)] == [("B", "s2")]  # C's waits for B's
    h.finish("B", "big", 1.2)
    h.take(h.core.advance(1.2 + h.settings.drain_s))
    assert ("C", "s2") in [(c.app, c.server) for c in h.loads.values()]
