"""The autoscaling rule (Ray Serve's) and the power of two choices, pure."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from failsoft.domain import Autoscaling
from failsoft.policies.autoscale import Autoscaler, desired_replicas
from failsoft.policies.replica_routing import power_of_two


def test_desired_replicas_is_ceil_of_ongoing_over_target_clamped():
    c = Autoscaling(min_replicas=1, max_replicas=4, target_ongoing_requests=2)
    assert [desired_replicas(c, n) for n in (0, 1, 2, 2.5, 4, 5, 100)] == [1, 1, 1, 2, 2, 3, 4]


def test_a_wish_is_carried_out_only_once_it_held_for_its_delay():
    c = Autoscaling(1, 4, 1.0, upscale_delay_s=1.0, downscale_delay_s=3.0, look_back_s=0.01)
    a = Autoscaler(c)
    a.observe(0.0, 3)
    assert a.decide(0.0, 1) == 1
    a.observe(0.5, 0)  # the wish is interrupted: its delay starts again
    assert a.decide(0.5, 1) == 1
    a.observe(0.6, 3)
    assert a.decide(0.6, 1) == 1
    a.observe(1.59, 4)  # up again, larger: the delay still counts from 0.6
    assert a.decide(1.59, 1) == 1
    a.observe(1.6, 4)
    assert a.decide(1.6, 1) == 4
    a.observe(2.0, 0)
    assert a.decide(2.0, 4) == 4 and a.decide(4.99, 4) == 4
    assert a.decide(5.0, 4) == 1


def test_the_look_back_window_averages_readings():
    a = Autoscaler(Autoscaling(1, 8, 1.0, look_back_s=1.0))
    for t, n in ((0.0, 8), (0.5, 0), (1.0, 4), (1.6, 2)):
        a.observe(t, n)
    assert a.average() == pytest.approx(3.0)  # 8 and 0 fell out of the last second


def test_bounds_are_checked_with_the_field_named():
    with pytest.raises(ValueError, match="target_ongoing_requests must be > 0"):
        Autoscaling(1, 2, 0)
    with pytest.raises(ValueError, match="min_replicas \\(3\\) is above max_replicas \\(2\\)"):
        Autoscaling(3, 2)


def test_power_of_two_picks_the_less_loaded_of_two_and_spreads_ties():
    rng = random.Random(0)
    assert power_of_two(["a"], {}, rng) == "a"
    picks = Counter(power_of_two(["a", "b"], {"a": 5, "b": 1}, rng) for _ in range(100))
    assert picks == Counter({"b": 100})
    picks = Counter(power_of_two(["a", "b", "c"], {"a": 0, "b": 0, "c": 9}, rng) for _ in range(3000))
    assert picks["c"] == 0 and abs(picks["a"] - picks["b"]) < 300
    with pytest.raises(ValueError, match="at least one"):
        power_of_two([], {}, rng)
