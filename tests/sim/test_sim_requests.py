"""The simulator's serving queues run the runtime's disciplines: batches, deadlines, admission."""

from __future__ import annotations

import dataclasses
import math

import pytest
import simpy
from sim_tiny import BIG, FAILURE_AT, NOTIFY_S, tiny_scenario

from failsoft.domain import App, Family, Placement, Scenario, Server, Variant
from failsoft.errors import ConfigError
from failsoft.sim import Deployer, RequestMode, SimConfig, simulate_failure
from failsoft.sim.requests import Request, RequestCore

PROFILED = Variant("p", 100, 0.9, 100, 10.0, batch_latency_ms=((1, 10.0), (2, 12.0), (4, 16.0)))


def one_app_core(config: SimConfig) -> tuple[simpy.Environment, RequestCore]:
    scenario = Scenario(
        (Server("s", "a", 1000),),
        (Family("f", (PROFILED,)),),
        (App("A", "f", Placement("s", "p"), rate_rps=1),),
    )
    env = simpy.Environment()
    return env, RequestCore(env, scenario, ["A"], config, "seed")


def burst(env: simpy.Environment, core: RequestCore, n: int, deadline_s: float = math.inf) -> list[Request]:
    requests = [Request("A", env.now, deadline_s=deadline_s) for _ in range(n)]
    for request in requests:
        core.issued.append(request)
        core.instances[("s", "A")].put(request)
    return requests


def test_a_batch_takes_the_variants_measured_batch_latency():
    env, core = one_app_core(SimConfig(max_batch=4))
    requests = burst(env, core, 6)
    env.run()
    done = [r.done_at for r in requests]
    assert done == [pytest.approx(0.016)] * 4 + [pytest.approx(0.016 + 0.012)] * 2  # 4 rows, then 2


def test_a_bounded_queue_refuses_what_it_cannot_hold():
    env, core = one_app_core(SimConfig(max_batch=1, max_queue=2))
    requests = burst(env, core, 5)
    env.run()
    assert [r.dropped for r in requests] == [False, False, True, True, True]
    stats = core.stats()
    assert (len(stats.latencies_ms), stats.dropped, stats.unserved) == (2, 3, 0)


@pytest.mark.parametrize("discipline", ["fifo", "batch-lazy-drop", "edf"])
def test_admission_refuses_what_cannot_finish_before_its_deadline(discipline):
    env, core = one_app_core(SimConfig(max_batch=1, discipline=discipline))
    requests = burst(env, core, 3, deadline_s=0.025)  # two 10 ms batches fit, a third does not
    env.run()
    assert [r.dropped for r in requests] == [False, False, True]
    assert [r.done_at for r in requests[:2]] == [pytest.approx(0.010), pytest.approx(0.020)]


def test_clients_that_give_up_are_not_served_late_after_an_outage():
    config = SimConfig(
        failure_at_s=FAILURE_AT,
        check_interval_s=0.1,
        request_warmup_s=0.3,
        random_phases=False,
        trace=True,
        requests=RequestMode.ALL,
        request_timeout_ms=300.0,
        discipline="batch-lazy-drop",
        max_batch=4,
    )
    deployment = Deployer().deploy(tiny_scenario(rate_rps=20.0), "faillite")
    event = simulate_failure(deployment, ("s0",), config)
    c = [r for r in event.request_log if r.app == "C"]
    told = event.apps["C"].serving_at + NOTIFY_S  # C's client learns its new location
    stale = [r for r in c if FAILURE_AT <= r.issued_at < told - 0.3 - BIG.latency_ms / 1000]
    assert len(stale) > 5 and all(r.dropped for r in stale)  # held past their deadline: dropped
    served = [r for r in event.request_log if r.done_at is not None]
    assert served and all(r.done_at <= r.deadline_s + 1e-9 for r in served)  # nobody answered late
    assert any(r.done_at is not None and r.issued_at > told for r in c)  # C serves again
    stats = event.requests
    assert (
        stats is not None
        and stats.dropped == sum(r.dropped for r in event.request_log)
        and stats.unserved == 0
    )


@pytest.mark.parametrize(
    "changes",
    [{"discipline": "lifo"}, {"max_batch": 65}, {"max_queue": 0}, {"request_timeout_ms": 0.0}],
)
def test_bad_queue_settings_are_refused_with_their_name(changes):
    with pytest.raises(ConfigError, match=next(iter(changes))):
        SimConfig(**changes)


def test_the_default_queue_is_fifo_without_deadlines_or_bound():
    config = SimConfig()
    assert (config.discipline, config.max_batch, config.max_queue, config.request_timeout_ms) == (
        "fifo",
        1,
        None,
        None,
    )
    assert dataclasses.replace(config, discipline="edf").discipline == "edf"
