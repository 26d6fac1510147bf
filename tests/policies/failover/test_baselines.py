"""FailLite vs. the full-size baselines under tight headroom (FailLite 5.3, Fig. 8)."""

import dataclasses
import statistics

import pytest

from failsoft.domain import ActionKind, PolicyParams
from failsoft.policies.registry import get_failover_policy
from failsoft.profiles import load_profile_families
from failsoft.synth import ClusterShape, synthesize

POLICIES = ["faillite", "full-warm", "full-cold", "full-warm-k"]


def recovery_rates(headroom: float, seed: int = 0) -> dict[str, float]:
    families = load_profile_families()
    scenario = synthesize(
        families, ClusterShape(40, 4, 256, headroom=headroom, policy=PolicyParams(seed=seed)), seed=seed
    )
    rates = {}
    for name in POLICIES:
        policy = get_failover_policy(name)
        with_warm = policy.with_warm(scenario)
        per_failure = []
        for server in [s.name for s in scenario.servers][::4]:
            plan = policy.plan_failover(with_warm, [server])
            affected = len(plan.actions) + len(plan.unrecovered)
            if affected:
                per_failure.append(len(plan.actions) / affected)
        assert len(per_failure) >= 5, (name, per_failure)  # a rate over failures that affected apps
        rates[name] = statistics.mean(per_failure)
    return rates


def test_baselines_fall_below_faillite_when_headroom_is_tight():
    rates = recovery_rates(headroom=0.10)
    assert rates["faillite"] == 1.0
    for name in ("full-warm", "full-cold", "full-warm-k"):
        assert rates[name] < 0.95, (name, rates)
    # full-warm has no cold path: the worst of all, as in FailLite Fig. 8a
    assert rates["full-warm"] <= min(rates["full-cold"], rates["full-warm-k"])


def test_with_ample_headroom_cold_capable_policies_recover_everything():
    rates = recovery_rates(headroom=0.5)
    for name in ("faillite", "full-cold", "full-warm-k"):
        assert rates[name] == pytest.approx(1.0), (name, rates)


def test_full_cold_uses_no_warm_backups_and_full_size_models():
    families = load_profile_families()
    scenario = synthesize(families, ClusterShape(10, 2, 60, headroom=0.3), seed=2)
    policy = get_failover_policy("full-cold")
    with_warm = policy.with_warm(scenario)
    assert not with_warm.warm
    plan = policy.plan_failover(with_warm, ["s00"])
    on_s00 = {a.name for a in scenario.apps if a.primary.server == "s00"}
    assert len(plan.actions) >= 3 and {a.app for a in plan.actions} | set(plan.unrecovered) == on_s00
    for action in plan.actions:
        assert action.kind is ActionKind.COLD
        assert action.final_variant == action.first_variant == scenario.app(action.app).primary.variant


def test_full_cold_order_is_critical_first_then_random_and_seeded():
    families = load_profile_families()
    scenario = synthesize(families, ClusterShape(10, 2, 80, headroom=0.5), seed=5)
    policy = get_failover_policy("full-cold")

    def order(seed: int) -> list[str]:
        seeded = dataclasses.replace(scenario, policy=dataclasses.replace(scenario.policy, seed=seed))
        plan = policy.plan_failover(policy.with_warm(seeded), ["s00", "s01"])
        return [a.app for a in plan.actions]

    first = order(0)
    critical = [scenario.app(a).critical for a in first]
    assert 1 <= sum(critical) < len(first) - 3  # critical and several non-critical apps to order
    assert critical == sorted(critical, reverse=True)  # every critical app before any other
    assert order(0) == first  # the same seed, the same order

    def others(apps: list[str]) -> list[str]:
        return [a for a in apps if not scenario.app(a).critical]

    assert any(others(order(seed)) != others(first) for seed in (1, 2, 3))  # the seed orders the rest
