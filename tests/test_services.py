"""Services, their per-mode parameters and the bounds written once on the field."""

import dataclasses

import pytest

from failsoft.domain import PolicyParams, Variant
from failsoft.errors import ConfigError
from failsoft.scenario import scenario_from_dict, scenario_to_dict
from failsoft.services import (
    CodedParams,
    GraphNode,
    GraphParams,
    Service,
    ServiceMode,
    SingleParams,
    check_services,
    with_singles,
)


def _scenario(**extra):
    data = {
        "servers": [{"name": "s1", "site": "a", "memory_mb": 100}],
        "families": {
            "f": [{"variant": "v", "memory_mb": 1, "accuracy": 0.5, "load_ms": 1, "latency_ms": 1}],
            "g": [{"variant": "w", "memory_mb": 1, "accuracy": 0.5, "load_ms": 1, "latency_ms": 1}],
        },
        "apps": [{"name": n, "family": "g" if n == "other" else "f"} for n in ("d0", "d1", "p0", "other")],
    }
    return data | extra


def test_policy_params_bounds_hold_in_code_and_in_files_alike():
    with pytest.raises(ValueError, match=r"PolicyParams.alpha must be <= 1; got 1.5"):
        PolicyParams(alpha=1.5)
    with pytest.raises(ValueError, match="warm_replicas"):
        dataclasses.replace(PolicyParams(), warm_replicas=-1)
    with pytest.raises(
        ConfigError, match=r"policy.alpha: Input should be less than or equal to 1 \(got 1.5\)"
    ):
        scenario_from_dict(_scenario(policy={"alpha": 1.5}))
    with pytest.raises(ConfigError, match="policy: unknown field 'alhpa'"):
        scenario_from_dict(_scenario(policy={"alhpa": 0.2}))
    assert scenario_from_dict(_scenario(policy={"alpha": 0.3})).policy == PolicyParams(alpha=0.3)


def test_the_serving_config_takes_the_same_policy_bounds():
    from failsoft.runtime.config import config_from_dict

    base = {
        "servers": [{"name": "s1", "site": "a", "memory_mb": 10}],
        "apps": [{"name": "a", "family": "f"}],
    }
    assert config_from_dict(base | {"failover": {"alpha": 0.4}}).params.alpha == 0.4
    for bad in ({"alpha": 2}, {"ilp_mip_gap": 1.0}, {"warm_replicas": 17}):
        with pytest.raises(ConfigError, match=f"failover.{next(iter(bad))}"):
            config_from_dict(base | {"failover": bad})


def test_a_coded_service_parses_round_trips_and_checks_its_members():
    svc = {"name": "digits", "mode": "coded", "members": ["d0", "d1", "p0"], "params": {"k": 2, "r": 1}}
    scenario = scenario_from_dict(_scenario(services=[svc]))
    (service,) = scenario.services
    assert service.mode is ServiceMode.CODED and service.params == CodedParams(k=2, r=1)
    assert scenario_from_dict(scenario_to_dict(scenario)).services == scenario.services
    everything = {s.name: s for s in scenario.all_services()}
    assert set(everything) == {"digits", "other"} and everything["other"].mode is ServiceMode.SINGLE


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ({"members": ["d0", "d1"]}, "a coded service has 3 members (k + r), got 2"),
        ({"params": {"k": 5}}, "params: k: Input should be less than or equal to 4 (got 5)"),
        ({"params": {"encoder": "xor"}}, "encoder: Input should be 'add' or 'concat'"),
        ({"params": {"encoder": "concat", "k": 3}, "members": ["d0", "d1", "p0", "other"]}, "k of 2 or 4"),
        ({"members": ["d0", "d1", "nope"]}, "member 'nope' is not an app"),
        ({"members": ["d0", "other", "p0"]}, "serve different families"),
        ({"name": "d0"}, "has the name of an app"),
        ({"mode": "teleport"}, "mode"),
        ({"params": {"k": 2, "bogus": 1}}, "unknown field 'bogus'"),
    ],
)
def test_a_bad_service_is_one_clear_error_before_anything_runs(service, message):
    svc = {"name": "digits", "mode": "coded", "members": ["d0", "d1", "p0"]} | service
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(_scenario(services=[svc]))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_app_belongs_to_one_service_at_most():
    apps = {n: Variant(n, 1, 0.5, 1, 1) for n in ("a", "b", "c", "d")}
    apps = {n: type("A", (), {"family": "f"})() for n in apps}
    one = Service("one", ServiceMode.SLO, ("a", "b"), SloParamsDefault())
    two = Service("two", ServiceMode.SLO, ("b", "c"), SloParamsDefault())
    with pytest.raises(ConfigError, match="'b' is a member of both 'one' and 'two'"):
        check_services([one, two], apps)
    assert [s.name for s in with_singles([one], ["a", "b", "c", "d"])] == ["one", "c", "d"]


def SloParamsDefault():
    from failsoft.services import SloParams

    return SloParams()


def test_graph_params_refuse_cycles_unknown_nodes_and_members_that_compute_nothing():
    nodes = (GraphNode("x", "a"), GraphNode("y", "b", stateful=True))
    assert GraphParams(nodes, (("x", "y"),)).nodes[1].stateful
    with pytest.raises(ValueError, match="cycle through node 'x'"):
        GraphParams(nodes, (("x", "y"), ("y", "x")))
    with pytest.raises(ValueError, match="unknown node 'z'"):
        GraphParams(nodes, (("x", "z"),))
    with pytest.raises(ConfigError, match="each member computes exactly one node"):
        Service("g", ServiceMode.GRAPH, ("a", "b", "c"), GraphParams(nodes, ()))


def test_a_service_with_the_wrong_parameter_class_is_refused():
    with pytest.raises(ConfigError, match="mode 'coded' takes CodedParams, got SingleParams"):
        Service("s", ServiceMode.CODED, ("a", "b", "c"), SingleParams())


def test_batch_latency_interpolates_measurements_and_falls_back_to_the_batch_cost():
    v = Variant("v", 1, 0.5, 1, 2.0, batch_latency_ms=((1, 2.0), (4, 5.0), (16, 14.0)))
    assert v.latency_at(1) == 2.0
    assert v.latency_at(2) == pytest.approx(3.0)
    assert v.latency_at(10) == pytest.approx(9.5)
    assert v.latency_at(32) == pytest.approx(28.0)  # past the largest: its per-request cost
    plain = Variant("p", 1, 0.5, 1, 2.0)
    assert plain.latency_at(3) == pytest.approx(6.0)
    assert plain.latency_at(3, batch_cost=0.5) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        v.latency_at(0)
