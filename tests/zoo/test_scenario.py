"""Profiles feed the planners: the families section a repository or a CSV turns into."""

from __future__ import annotations

import pytest

from failsoft.policies.registry import get_failover_policy
from failsoft.scenario import scenario_from_dict
from failsoft.zoo import families_from_csv, families_section


def test_repository_families_make_a_valid_scenario_the_planner_accepts(tiny_zoo):
    section = families_section(tiny_zoo.families())
    assert [v["variant"] for v in section["digits_mlp"]] == ["mlp_xs", "mlp_s", "mlp_m", "mlp_l"]
    assert all(v["accuracy_source"] == "measured" for v in section["digits_mlp"])
    scenario = scenario_from_dict(
        {
            "servers": [
                {"name": "s1", "site": "a", "memory_mb": 1000},
                {"name": "s2", "site": "b", "memory_mb": 1000},
            ],
            "families": section,
            "apps": [
                {
                    "name": "digits-1",
                    "family": "digits_mlp",
                    "primary": {"server": "s1", "variant": "mlp_l"},
                    "critical": True,
                }
            ],
        }
    )
    # the measurements only a profiled zoo has travel with it: per-batch latency, the load's split
    mlp_l = next(v for v in scenario.family("digits_mlp").variants if v.name == "mlp_l")
    profiled = tiny_zoo.variant("digits_mlp", "mlp_l")
    assert mlp_l.load_cpu_ms == pytest.approx(profiled.load_cpu_ms, abs=1e-3)
    assert mlp_l.warm_load_ms == pytest.approx(profiled.warm_load_ms, abs=1e-3)
    assert [b for b, _ in mlp_l.batch_latency_ms] == [b for b, _ in profiled.batch_latency_ms] == [1, 4, 16]
    plan = get_failover_policy("faillite").plan_failover(scenario, ["s1"])
    assert plan.action_for("digits-1") is not None
    assert plan.action_for("digits-1").server == "s2"


def test_csv_families_keep_their_measurements():
    (convnext,) = families_from_csv(families=["convnext"])
    section = families_section([convnext])["convnext"]
    assert section[0]["variant"] == "convnext_tiny"
    assert section[0]["accuracy_source"] == "declared"
    assert section[-1]["memory_mb"] > section[0]["memory_mb"]
