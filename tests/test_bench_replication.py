"""``failsoft bench replication``'s pure parts: settings, the plan of each graph, the per-policy
config, the failure-free walk of a graph, the summaries and the target checks. The bench itself runs
clusters (a minute a policy); the runtime pieces it measures are tested in
tests/runtime/test_graph_failover.py and tests/runtime/gateway/test_graph_failover.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from failsoft.bench.replication import (
    ReplicationBenchSettings,
    Run,
    Shot,
    bench_config,
    plans_of,
    policy_config,
    summary,
    targets_met,
    walk_graph,
    with_overhead,
)
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "graph-auto-pilot.yaml"


def test_bad_settings_are_refused_naming_the_value():
    with pytest.raises(ConfigError, match="unknown replication policy 'remus'"):
        ReplicationBenchSettings(policies=("remus",))
    with pytest.raises(ConfigError, match="no replication policy"):
        ReplicationBenchSettings(policies=())
    with pytest.raises(ConfigError, match="requests must be >= 2"):
        ReplicationBenchSettings(requests=1)
    with pytest.raises(ConfigError, match="after_kill >= 1"):
        ReplicationBenchSettings(after_kill=0)
    with pytest.raises(ConfigError, match="ship_interval_ms must be in"):
        ReplicationBenchSettings(ship_interval_ms=-1.0)
    with pytest.raises(ConfigError, match="rounds must be >= 1"):
        ReplicationBenchSettings(rounds=0)
    with pytest.raises(ConfigError, match="timeout_s must be positive"):
        ReplicationBenchSettings(timeout_s=0)


def test_the_auto_pilot_example_is_planned_with_c2s_primary_server_killed_and_runs_each_policy():
    data, (plan,) = bench_config(EXAMPLE, ReplicationBenchSettings(root="/zoo"))
    assert data["repository"] == "/zoo" and data["gateway"]["port"] == 0
    assert (plan.service, plan.kill_node, plan.kill_server) == ("autopilot", "c2", "s1")
    assert plan.stateful == ("c2", "c3") and plan.on_killed_server == ("c2",)  # no other model loses state
    assert plan.entry == "c0" and plan.models["c6"] == ("sp500_gru2", "gru_16_x2")
    for policy in ("nspb", "stop-and-copy", "none"):
        (service,) = config_from_dict(policy_config(data, "autopilot", policy), source="t").services
        assert service.params.replication == policy
        assert service.params.ship_interval_ms == (0.0 if policy == "stop-and-copy" else 100.0)
    every = policy_config(data, "autopilot", "nspb", ship_interval_ms=0.0)  # --ship-interval-ms 0
    assert config_from_dict(every, source="t").services[0].params.ship_interval_ms == 0.0
    assert data["services"][0]["params"]["replication"] == "nspb"  # the original is untouched
    _, (other,) = bench_config(EXAMPLE, ReplicationBenchSettings(kill_node="c3"))
    assert (other.kill_node, other.kill_server) == ("c3", "s3")


def test_configs_without_a_stateful_graph_or_with_a_bad_kill_node_are_refused(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    with pytest.raises(ConfigError, match="kill node 'c4' is not one of its stateful nodes"):
        plans_of(data, "c4", "x")
    for node in data["services"][0]["params"]["nodes"]:
        node["stateful"] = False
    with pytest.raises(ConfigError, match="needs a graph service with a stateful node"):
        plans_of(data, None, "x")


def test_the_failure_free_walk_joins_a_fan_in_in_joins_order_and_carries_each_nodes_state():
    data = yaml.safe_load(EXAMPLE.read_text())
    (service,) = config_from_dict(data, source="t").services
    state: dict[str, float] = {}

    def node(name: str, scale: float):
        def compute(x: np.ndarray) -> np.ndarray:  # out = sum(x) * scale + the calls so far
            state[name] = state.get(name, 0.0) + 1.0
            return np.asarray([[float(np.sum(x)) * scale + state[name]]])

        return compute

    compute = {f"c{i}": node(f"c{i}", 2.0 if i == 5 else 1.0) for i in range(6)}
    compute["c6"] = lambda x: np.asarray(x) * np.asarray([[10.0, 1.0]])  # shows the join's order
    out = walk_graph(service.params, compute, [np.asarray([[1.0]]), np.asarray([[1.0]])])
    # request 1: c0..c3 add 1 each (1 -> 5); c4 = 5 + 1, c5 = 2 * 5 + 1; c6 joins [c4, c5]
    np.testing.assert_array_equal(out[0], [[60.0, 11.0]])
    # request 2: every node's count moved on to 2: c0..c3 give 3, 5, 7, 9; c4 11, c5 20
    np.testing.assert_array_equal(out[1], [[110.0, 20.0]])


def _shot(i: int, ms: float, seq: int | None, value: float | None, at: float = 0.0) -> Shot:
    outputs = None if value is None else np.asarray([[value]])
    return Shot(i, at, at + ms / 1000.0, seq, outputs, None if seq else "NoRouteError: x")


def test_summary_measures_latency_after_warmup_recovery_from_the_kill_and_compares_every_answer():
    shots = [_shot(0, 100.0, 1, 1.0)]  # warm-up: not in the latency
    shots += [_shot(i, 10.0 + i, i + 1, float(i + 1)) for i in range(1, 5)]  # 11..14 ms
    killed = 10.0
    shots += [_shot(5, 1.0, None, None, at=10.0)]  # failed after the kill
    shots += [_shot(6, 90.0, 7, 7.0, at=10.01), _shot(7, 5.0, 8, 99.0, at=10.2)]
    expected = [np.asarray([[float(i + 1)]]) for i in range(8)]
    got = summary([Run(shots, killed, expected)], warmup=1, n_before=5)
    assert got["latency_ms"] == {"p50": 12.5, "p99": 13.97}
    assert got["recovery_ms"] == pytest.approx(100.0)  # the first answer after the kill, from the kill
    assert got["failed_requests"] == 1 and got["errors"] == ["NoRouteError: x"]
    assert got["mismatched"] == 1 and got["first_mismatch_seq"] == [8] and got["mismatched_before_kill"] == 0
    assert got["consistent"] is False
    fixed = [*shots[:5], _shot(5, 1.0, 6, 6.0, at=10.0), shots[6], _shot(7, 5.0, 8, 8.0, at=10.2)]
    assert summary([Run(fixed, killed, expected)], 1, 5)["consistent"] is True
    lost = [*fixed[:5], _shot(5, 1.0, None, None, at=10.0), *fixed[6:]]  # equal answers, one lost
    assert summary([Run(lost, killed, expected)], 1, 5)["consistent"] is False


def test_runs_are_pooled_and_one_inconsistent_run_makes_the_policy_inconsistent():
    expected = [np.asarray([[float(i + 1)]]) for i in range(4)]
    good = [_shot(i, 10.0, i + 1, float(i + 1), at=float(i)) for i in range(4)]
    slow = [_shot(i, 30.0, i + 1, float(i + 1), at=float(i)) for i in range(4)]
    bad = [*slow[:3], _shot(3, 30.0, 4, 0.5, at=3.0)]
    runs = [Run(good, 1.99, expected), Run(bad, 1.95, expected)]  # the kill before shot 2
    got = summary(runs, warmup=0, n_before=2)
    assert got["runs"] == 2 and got["requests"] == 8
    assert got["latency_ms"]["p50"] == 20.0  # 10, 10, 30, 30 pooled
    assert got["recovery_ms_each"] == [pytest.approx(20.0), pytest.approx(80.0)]
    assert got["recovery_ms"] == pytest.approx(50.0)  # the median of the runs'
    assert got["consistent"] is False and got["first_mismatch_seq"] == [4]
    assert summary(runs[:1], 0, 2)["consistent"] is True


def test_overhead_is_against_none_and_the_targets_name_what_is_met():
    policies = with_overhead(
        {
            "nspb": {"latency_ms": {"p50": 10.3}, "recovery_ms": 120.0, "consistent": True},
            "none": {"latency_ms": {"p50": 10.0}, "recovery_ms": 400.0, "consistent": False},
        }
    )
    assert policies["nspb"]["overhead_pct"] == 3.0 and policies["none"]["overhead_pct"] == 0.0
    met = targets_met({"g": {"policies": policies}})
    assert met["g"] == {
        "nspb_overhead": True,
        "nspb_recovery": True,
        "nspb_consistent": True,
        "none_inconsistent_after_failure": True,
    }
    policies["nspb"] = {**policies["nspb"], "overhead_pct": 4.5, "recovery_ms": 300.0}
    met = targets_met({"g": {"policies": policies}})["g"]
    assert met["nspb_overhead"] is False and met["nspb_recovery"] is False
    assert with_overhead({"nspb": {"latency_ms": {"p50": 10.0}}})["nspb"]["overhead_pct"] is None
    policies["stop-and-copy"] = {"latency_ms": {"p50": 14.0}, "consistent": True}
    assert targets_met({"g": {"policies": policies}})["g"]["nspb_p50_below_stop_and_copy"] is True
