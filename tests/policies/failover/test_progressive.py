"""Progressive failover (FailLite 3.3, Algorithm 1) and the failover plans of every policy."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from failsoft.domain import ActionKind, App, Demand, Placement, PolicyParams, Scenario, Server, WarmBackup
from failsoft.errors import ConfigError
from failsoft.policies.failover.ledger import Ledger
from failsoft.policies.failover.progressive import demand_ratio, match, place_progressive
from failsoft.policies.registry import failover_names as policy_names
from failsoft.policies.registry import get_failover_policy
from tests.factories import make_family, random_scenario
from tests.policies.failover.checks import check_failover_plan

FAMILY = make_family("f", [(100, 0.70, 2.0), (200, 0.75, 4.0), (400, 0.78, 8.0), (800, 0.80, 16.0)])


def test_demand_ratio_is_the_tightest_resource():
    assert demand_ratio(Demand(500, 2.0), Demand(1000, 1.0)) == 0.5
    assert demand_ratio(Demand(5000, 0.25), Demand(1000, 1.0)) == 0.25
    assert demand_ratio(Demand(10, 0), Demand(0, 0)) == float("inf")


@pytest.mark.parametrize(("delta", "expected"), [(2.0, 3), (1.0, 3), (0.5, 2), (0.3, 1), (0.2, 1), (0.01, 0)])
def test_match_picks_the_variant_closest_to_delta_of_the_full_size(delta, expected):
    assert match(FAMILY.variants, delta) == expected


def one_site(servers, apps, warm=None, **policy):
    return Scenario(tuple(servers), (FAMILY,), tuple(apps), PolicyParams(**policy), warm)


def test_small_variant_is_loaded_first_then_the_selected_one():
    servers = [Server("s1", "a", 1000), Server("s2", "a", 1000)]
    apps = [App("x", "f", Placement("s1", "f-3"), rate_rps=1)]
    plan = get_failover_policy("faillite").plan_failover(one_site(servers, apps, warm=()), ["s1"])
    (action,) = plan.actions
    assert action.kind is ActionKind.PROGRESSIVE and action.server == "s2"
    assert action.first_variant == "f-0" and action.final_variant == "f-3"


def test_final_variant_is_lowered_to_keep_room_for_the_small_one():
    servers = [Server("s1", "a", 1000), Server("s2", "a", 850)]
    apps = [App("x", "f", Placement("s1", "f-3"), rate_rps=1)]
    plan = get_failover_policy("faillite").plan_failover(one_site(servers, apps, warm=()), ["s1"])
    (action,) = plan.actions
    # 800 + 100 would not fit in 850: serve f-0 at once, then f-2 (400 + 100 fits), not f-3 after 1.6 s
    assert (action.first_variant, action.final_variant, action.stand_in_server) == ("f-0", "f-2", "s2")


def test_final_variant_loads_directly_when_no_room_can_be_made():
    servers = [Server("s1", "a", 1000), Server("s2", "a", 250)]
    apps = [App("x", "f", Placement("s1", "f-3"), rate_rps=1)]
    plan = get_failover_policy("faillite").plan_failover(one_site(servers, apps, warm=()), ["s1"])
    (action,) = plan.actions
    assert action.first_variant == action.final_variant == "f-1"  # 200 MB: f-1 + f-0 would need 300


def test_small_variant_stands_in_on_another_server_when_the_final_fills_its_own():
    servers = [Server("s0", "a", 1000), Server("s1", "a", 850), Server("s2", "a", 150)]
    apps = [App("x", "f", Placement("s0", "f-3"), rate_rps=1)]
    sc = one_site(servers, apps, warm=())
    plan = get_failover_policy("faillite").plan_failover(sc, ["s0"])
    (action,) = plan.actions
    assert (action.server, action.final_variant) == ("s1", "f-3")
    assert (action.stand_in_server, action.first_variant) == ("s2", "f-0")
    assert plan.to_dict()["actions"][0]["first_server"] == "s2"
    check_failover_plan(sc, ["s0"], plan)


def test_degrades_to_a_smaller_variant_when_capacity_is_short():
    servers = [Server("s1", "a", 1000), Server("s2", "a", 450)]
    apps = [App("x", "f", Placement("s1", "f-3"), rate_rps=1)]
    plan = get_failover_policy("faillite").plan_failover(one_site(servers, apps, warm=()), ["s1"])
    (action,) = plan.actions
    # delta = 450 / 800 matches f-2 (400 MB); keeping 100 MB for f-0 to serve first lowers it to f-1
    assert (action.first_variant, action.final_variant) == ("f-0", "f-1")


def test_warm_backup_is_used_when_alive_and_skipped_when_it_failed_too():
    servers = [Server(f"s{i}", "a", 1000) for i in range(3)]
    apps = [App("x", "f", Placement("s0", "f-3"), critical=True, rate_rps=1)]
    warm = (WarmBackup("x", "f-1", "s1"),)
    policy = get_failover_policy("faillite")
    plan = policy.plan_failover(one_site(servers, apps, warm=warm), ["s0"])
    assert plan.actions[0].kind is ActionKind.WARM and plan.actions[0].server == "s1"
    plan = policy.plan_failover(one_site(servers, apps, warm=warm), ["s0", "s1"])
    assert plan.actions[0].kind is ActionKind.PROGRESSIVE and plan.actions[0].server == "s2"


def test_make_room_releases_warm_backups_of_healthy_apps():
    # s1's room is taken by the warm backup of w, whose primary (on s2) is healthy
    servers = [Server("s0", "a", 900), Server("s1", "a", 850), Server("s2", "a", 850)]
    apps = [
        App("x", "f", Placement("s0", "f-3"), rate_rps=1),
        App("w", "f", Placement("s2", "f-3"), critical=True, rate_rps=1),
    ]
    sc = one_site(servers, apps, warm=(WarmBackup("w", "f-3", "s1"),))
    paper = get_failover_policy("faillite").plan_failover(
        sc.replace(policy=PolicyParams(reclaim_warm=False)), ["s0"]
    )
    assert paper.unrecovered == ("x",) and paper.released == ()
    plan = get_failover_policy("faillite").plan_failover(sc, ["s0"])
    assert plan.unrecovered == ()
    assert plan.released == (WarmBackup("w", "f-3", "s1"),)
    assert plan.actions[0].server == "s1"
    check_failover_plan(sc, ["s0"], plan)


def test_unknown_failed_server_is_an_error_naming_it():
    sc = one_site([Server("s0", "a", 900)], [])
    with pytest.raises(ConfigError, match="'nope'"):
        get_failover_policy("faillite").plan_failover(sc, ["nope"])
    with pytest.raises(ConfigError, match="unknown failover policy 'best'"):
        get_failover_policy("best")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 100_000),
    n_servers=st.integers(2, 10),
    n_apps=st.integers(1, 40),
    n_failed=st.integers(1, 3),
    policy=st.sampled_from(["faillite", "full-warm", "full-cold", "full-warm-k"]),
)
def test_failover_never_overfills_and_accounts_for_every_app(seed, n_servers, n_apps, n_failed, policy):
    rng = random.Random(seed)
    scenario = random_scenario(rng, n_servers, n_apps, n_sites=2, compute=1000.0)
    failed = rng.sample([s.name for s in scenario.servers], min(n_failed, n_servers - 1))
    p = get_failover_policy(policy)
    with_warm = p.with_warm(scenario)
    plan = p.plan_failover(with_warm, failed)
    check_failover_plan(with_warm, failed, plan)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n_servers=st.integers(2, 12), n_apps=st.integers(1, 60))
def test_heuristic_recovers_every_app_when_aggregate_capacity_allows(seed, n_servers, n_apps):
    """Worst-fit can only strand an app when every server has less room than it needs; so if free
    memory exceeds the apps' smallest variants by one smallest variant per server, all are placed."""
    rng = random.Random(seed)
    scenario = random_scenario(
        rng, n_servers + 1, n_apps, n_sites=1, compute=1000.0, memory_range=(200, 2000)
    )
    affected = [a for a in scenario.apps]
    smallest = [scenario.family(a.family).smallest.memory_mb for a in affected]
    # servers with exactly enough aggregate room, plus the fragmentation allowance
    need = sum(smallest) + n_servers * max(smallest, default=0)
    capacity = {f"t{k}": Demand(need / n_servers + rng.uniform(0, 50), 1000.0) for k in range(n_servers)}
    result = place_progressive(scenario, affected, Ledger(capacity))
    assert result.unrecovered == []
    assert len(result.actions) == len(affected)


def test_heuristic_never_overfills_with_binding_compute(rng):
    for _ in range(30):
        scenario = random_scenario(rng, 6, 30, n_sites=2)
        capacity = {s.name: s.capacity for s in scenario.servers}
        ledger = Ledger(capacity)
        result = place_progressive(scenario, list(scenario.apps), ledger)
        used = {name: Demand() for name in capacity}
        for action in result.actions:
            app = scenario.app(action.app)
            used[action.server] += scenario.variant_of(app, action.final_variant).demand(app.rate_rps)
        for name, d in used.items():
            assert d.fits_in(capacity[name])
            assert ledger.free(name).memory_mb == pytest.approx(capacity[name].memory_mb - d.memory_mb)


def test_every_policy_is_registered():
    assert policy_names() == ["faillite", "full-cold", "full-warm", "full-warm-k"]
