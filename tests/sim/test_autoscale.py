"""Autoscaling in the simulator: the orchestration core, Ray Serve's rule and the power of two
choices (the runtime's code) under a load ramp on SimPy time; fixed seeds, exact decisions."""

from __future__ import annotations

import pytest

from failsoft.domain import App, Autoscaling, Family, Placement, PolicyParams, Scenario, Server, Variant
from failsoft.sim.autoscale import AutoscaleSim, Ramp

MODEL = Variant("m", 100, 0.9, 20, 10)  # 10 ms a request: one replica serves 100 rps
RAMP = Ramp(base_rps=40, peak_rps=250)  # 0.4x to 2.5x of one replica, held 10 s from 7 s


def scenario(autoscaling: Autoscaling | None) -> Scenario:
    servers = tuple(Server(f"s{i}", "a", 1000, 10) for i in range(3))
    app = App("a", "f", Placement("s0", "m"), False, 1.0, None, 1, autoscaling)
    return Scenario(servers, (Family("f", (MODEL,)),), (app,), PolicyParams(), ())


SCALING = Autoscaling(1, 3, target_ongoing_requests=1, upscale_delay_s=1.0, downscale_delay_s=3.0)


def test_a_ramp_scales_out_to_max_and_back_in_once_it_is_over():
    run = AutoscaleSim(scenario(SCALING), "a", RAMP, seed=0).simulate()
    steps = [(e["previous"], e["replicas"], e["reason"]) for e in run.events]
    assert steps == [(1, 3, "autoscale"), (3, 1, "autoscale")]
    up, down = (e["t"] for e in run.events)
    assert RAMP.lead_s < up < RAMP.lead_s + RAMP.up_s  # during the ramp, after the upscale delay
    assert down > RAMP.lead_s + RAMP.up_s + RAMP.hold_s  # not before the load went down
    served = {server for t, _, server in run.requests if up + 0.1 < t < down}
    assert served == {"s0", "s1", "s2"}  # the power of two choices used every replica
    assert run.timeline[-1][1] == 1
    unloaded = run.p99_ms(0, RAMP.lead_s)
    held = run.p99_ms(up + 5.0, RAMP.lead_s + RAMP.up_s + RAMP.hold_s)
    assert unloaded is not None and held is not None and held < 3 * unloaded


def test_without_autoscaling_the_same_ramp_overloads_its_one_replica():
    run = AutoscaleSim(scenario(None), "a", RAMP, seed=0).simulate()
    assert not run.events and {n for _, n, _ in run.timeline} == {1}
    held = run.p99_ms(RAMP.lead_s + RAMP.up_s, RAMP.lead_s + RAMP.up_s + RAMP.hold_s)
    assert held is not None and held > 20 * run.p99_ms(0, RAMP.lead_s)


def test_the_same_seed_gives_the_same_run():
    a = AutoscaleSim(scenario(SCALING), "a", RAMP, seed=3).simulate().to_dict()
    b = AutoscaleSim(scenario(SCALING), "a", RAMP, seed=3).simulate().to_dict()
    assert a == b and a["max_replicas"] == 3


@pytest.mark.parametrize("seed", [1, 2])
def test_other_seeds_scale_the_same_way(seed):
    run = AutoscaleSim(scenario(SCALING), "a", RAMP, seed=seed).simulate()
    assert [e["replicas"] for e in run.events] == [3, 1]
