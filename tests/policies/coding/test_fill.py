"""The fill timeout policy on explicit times: Erlang quantiles, the rate rule, the cap, the floor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from failsoft.errors import ConfigError
from failsoft.policies.coding.fill import FILL_QUANTILE, MIN_ARRIVALS, FillTimeout, erlang_quantile
from failsoft.policies.coding.groups import GroupFormer


def test_erlang_quantiles_match_their_closed_forms():
    # shape 1 is the exponential: -ln(1 - q); shape 2's CDF is 1 - e^-x (1 + x)
    assert erlang_quantile(1, 0.99) == pytest.approx(-math.log(0.01), rel=1e-9)
    x = erlang_quantile(2, 0.99)
    assert 1 - math.exp(-x) * (1 + x) == pytest.approx(0.99, abs=1e-12)
    x = erlang_quantile(3, 0.5)
    assert 1 - math.exp(-x) * (1 + x + x * x / 2) == pytest.approx(0.5, abs=1e-12)


def test_the_rate_policy_waits_the_quantile_of_the_fill_time_at_the_measured_rate():
    fill = FillTimeout(k=2, cap_ms=1000, policy="rate")
    assert fill.timeout_s() == 1.0  # no estimate yet: the cap
    for i in range(64):
        fill.arrived(i * 0.01)  # 100 per second
    assert fill.rate_per_s() == pytest.approx(100.0)
    assert fill.timeout_s() == pytest.approx(-math.log(1 - FILL_QUANTILE) / 100.0)
    k4 = FillTimeout(k=4, cap_ms=1000, policy="rate")
    for i in range(64):
        k4.arrived(i * 0.01)
    assert k4.timeout_s() == pytest.approx(erlang_quantile(3, FILL_QUANTILE) / 100.0)
    assert k4.timeout_s() > fill.timeout_s()  # k - 1 = 3 arrivals take longer than one


def test_the_rate_policy_is_capped_and_floored_and_fixed_ignores_the_rate():
    slow = FillTimeout(k=2, cap_ms=50, policy="rate")
    for i in range(MIN_ARRIVALS):
        slow.arrived(i * 1.0)  # one a second: the quantile (4.6 s) is above the cap
    assert slow.timeout_s() == 0.05
    burst = FillTimeout(k=2, cap_ms=50, policy="rate")
    for _ in range(MIN_ARRIVALS):
        burst.arrived(3.0)  # all at once: an infinite rate, floored at 1 ms
    assert burst.timeout_s() == 0.001
    fixed = FillTimeout(k=2, cap_ms=50, policy="fixed")
    for i in range(64):
        fixed.arrived(i * 0.01)
    assert fixed.rate_per_s() is None and fixed.timeout_s() == 0.05


def test_fill_policy_refuses_bad_values():
    with pytest.raises(ConfigError, match="'sometimes'"):
        FillTimeout(k=2, cap_ms=10, policy="sometimes")
    with pytest.raises(ConfigError, match="got -1"):
        FillTimeout(k=2, cap_ms=-1)
    with pytest.raises(ConfigError, match=r"got 1\.5"):
        erlang_quantile(1, 1.5)


def test_the_former_gives_each_group_the_timeout_in_force_when_it_opened():
    former = GroupFormer(k=2, fill_timeout_ms=1000, fill="rate")
    former.join("first", 0.0)
    assert former.next_timeout_s() == pytest.approx(1.0)  # no rate yet: the cap
    t = 0.0
    for i in range(63):  # 100 queries per second, groups fill one after another
        t = (i + 1) * 0.01
        former.join(i, t)
    assert former.waiting == 0  # 64 queries: 32 full groups
    former.join("lone", t + 0.01)
    expected = t + 0.01 + -math.log(1 - FILL_QUANTILE) / 100.0
    assert former.next_timeout_s() == pytest.approx(expected)
    assert former.poll(expected - 1e-6) == ()
    (group,) = former.poll(expected)
    assert group.keys == ("lone",) and not group.complete


def test_at_a_steady_poisson_rate_the_rate_policy_fills_about_q_of_the_groups_at_any_rate_and_k():
    rng = np.random.default_rng(0)
    for k in (2, 4):
        for rate in (20.0, 300.0):
            for fill, want in (("rate", (0.98, 1.0)), ("fixed", None)):
                former = GroupFormer(k, fill_timeout_ms=10_000 if fill == "rate" else 10, fill=fill)
                t, complete, partial = 0.0, 0, 0
                for i in range(20_000):
                    t += rng.exponential(1.0 / rate)
                    _, closed = former.join(i, t)
                    complete += sum(g.complete for g in closed)
                    partial += sum(not g.complete for g in closed)
                share = complete / (complete + partial)
                if want is not None:
                    assert want[0] <= share <= want[1], (k, rate, share)
                elif rate == 20.0:
                    assert share < 0.7, (k, rate, share)  # a 10 ms timeout at 20 qps codes few groups
