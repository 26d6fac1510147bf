"""Where a load's time goes: phases split into CPU, waiting for a core and blocked, measured on this
thread by the kernel's counters; an MTTR cut at a load's stamps; an agent's load reporting both."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from failsoft.runtime.load_phases import LoadPhases, split_ms, thread_times, timeline


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(100))


def test_a_phase_that_spins_is_cpu_or_runnable_and_one_that_sleeps_is_blocked():
    phases = LoadPhases()
    gc.disable()  # a collection of a long-lived worker's heap is this thread's CPU too (9 ms, once)
    try:
        with phases.phase("spin"):
            _spin(0.05)
        with phases.phase("sleep"):
            time.sleep(0.05)
    finally:
        gc.enable()
    spin, sleep = phases.phases["spin"], phases.phases["sleep"]
    assert spin["wall_ms"] >= 50.0 and sleep["wall_ms"] >= 50.0
    if thread_times()[1] is None:  # the kernel counts no run-queue time here: CPU only
        assert spin["runnable_ms"] is None and spin["blocked_ms"] is None
        return
    # spinning, the thread is on a core or waiting for one (a busy host): hardly ever blocked
    assert spin["blocked_ms"] < 0.2 * spin["wall_ms"]
    assert spin["cpu_ms"] + spin["runnable_ms"] == pytest.approx(spin["wall_ms"], rel=0.2)
    # sleeping, it is neither (on a busy host, waking up it may wait for a core: that is runnable)
    assert sleep["blocked_ms"] >= 45.0 and sleep["cpu_ms"] < 5.0


def test_a_phase_waiting_for_a_lock_another_thread_holds_is_blocked():
    lock, held = threading.Lock(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            time.sleep(0.05)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    phases = LoadPhases()
    with phases.phase("wait"), lock:
        pass
    thread.join()
    wait = phases.phases["wait"]
    assert wait["wall_ms"] >= 30.0
    if wait["blocked_ms"] is not None:
        assert wait["blocked_ms"] > 0.8 * wait["wall_ms"]


def test_split_never_reports_negative_blocked_time():
    assert split_ms(0.010, 0.008, 0.004) == {
        "wall_ms": 10.0,
        "cpu_ms": 8.0,
        "runnable_ms": 4.0,
        "blocked_ms": 0.0,  # the counters and the wall clock are read a moment apart
    }
    assert split_ms(0.010, 0.004, None)["blocked_ms"] is None


def test_the_timeline_cuts_the_mttr_into_consecutive_segments():
    detected = 1000.0
    stamps = {
        "plan_asked_at": detected + 0.002,
        "plan_done_at": detected + 0.005,
        "issued_at": detected + 0.025,  # waited 20 ms for a slot
        "entered_at": detected + 0.031,
        "read": {"wall_ms": 4.0, "cpu_ms": 1.0, "runnable_ms": 2.0, "blocked_ms": 1.0},
        "left_at": detected + 0.041,
        "returned_at": detected + 0.044,
    }
    out = timeline(stamps, detected, 45.0)
    assert out == {
        "plan_wait_ms": pytest.approx(2.0),
        "plan_ms": pytest.approx(3.0),
        "slot_wait_ms": pytest.approx(20.0),
        "call_ms": pytest.approx(6.0),
        "agent_ms": pytest.approx(10.0),
        "reply_ms": pytest.approx(3.0),
        "route_ms": pytest.approx(1.0),
        "agent": {"read": stamps["read"]},
    }
    # a load sent before the last plan was made (an earlier plan's): no plan segments, the first
    # segment runs from the detection to the load's sending
    late = stamps | {"plan_asked_at": detected + 0.030, "plan_done_at": detected + 0.032}
    out = timeline(late, detected, 45.0)
    assert "plan_ms" not in out and out["slot_wait_ms"] == pytest.approx(25.0)
    # the agent's note on its skeleton travels with its phases
    noted = timeline(stamps | {"skeleton": "prepared"}, detected, 45.0)
    assert noted["skeleton"] == "prepared" and noted["agent"] == {"read": stamps["read"]}


@pytest.mark.runtime
def test_an_agents_load_reports_its_phases_in_the_order_they_ran(agent):
    described = agent.load("app", "digits_mlp", "mlp_xs")
    phases = described["phases"]
    assert list(phases)[:2] == ["entered_at", "left_at"]
    assert [p for p in phases if p.endswith("_at") is False] == [
        "reserve", "start", "read", "warm_up", "serving_queue",
        "skeleton", "warm_up_sizes", "warm_up_after_route",
    ]  # fmt: skip
    assert phases["skeleton"] in ("prepared", "built")  # a note: whether one was ready ahead
    assert phases["entered_at"] <= phases["left_at"]
    # the load's time holds the phases after the reservation (and, between them, the reading of
    # the counters: on a busy host a thread may wait for a core there too); its CPU is the read's
    # and the warm-up's
    inside = sum(phases[p]["wall_ms"] for p in ("start", "read", "warm_up", "serving_queue"))
    assert 0 < inside <= described["load_ms"] + 0.5
    assert described["load_cpu_ms"] == pytest.approx(phases["read"]["cpu_ms"] + phases["warm_up"]["cpu_ms"])
    # a load the agent already holds reports none
    assert agent.load("app", "digits_mlp", "mlp_xs")["phases"] == {}
