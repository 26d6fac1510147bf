"""A recovery load at the speed of memory: the skeleton prepared ahead, the warm-up cut to the first
answer, the rest of it after the route (an agent in this process, the real tiny zoo)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from failsoft.runtime.deferred import Deferred

pytestmark = pytest.mark.runtime


def _answer(tiny_zoo, variant: str, batch: np.ndarray) -> np.ndarray:
    with tiny_zoo.load("digits_mlp", variant, "cpu") as model:
        return model.predict(batch)


def test_the_smallest_variants_skeleton_is_ready_used_once_and_replaced(agent, tiny_zoo):
    # the family's smallest by profiled memory (mlp_xs and mlp_s are within a measurement's noise of
    # each other, so the profile decides which; the name breaks a tie)
    (family,) = tiny_zoo.families(["digits_mlp"])
    smallest = min(family.variants, key=lambda v: (v.memory_mb, v.name)).name
    assert smallest in ("mlp_xs", "mlp_s")
    assert agent._deferred.drain(30.0)
    assert agent.info()["skeletons"]["ready"] == [f"digits_mlp/{smallest}"]
    described = agent.load("app", "digits_mlp", smallest)
    assert described["phases"]["skeleton"] == "prepared"
    assert agent._deferred.drain(30.0)
    skeletons = agent.info()["skeletons"]
    assert skeletons["ready"] == [f"digits_mlp/{smallest}"] and skeletons["taken"] == 1
    assert skeletons["built"] == 2  # the one at start, and its replacement after the load
    # a second app's load of the same variant takes the new one
    assert agent.load("other", "digits_mlp", smallest)["phases"]["skeleton"] == "prepared"
    batch = np.random.default_rng(5).random((3, 64), dtype=np.float32)
    for app in ("app", "other"):
        np.testing.assert_array_equal(agent.infer(app, smallest, batch), _answer(tiny_zoo, smallest, batch))


def test_a_load_without_a_prepared_skeleton_builds_its_own_and_answers_as_the_model(agent, tiny_zoo):
    described = agent.load("app", "digits_mlp", "mlp_m")  # not a target: nothing prepared for it
    assert described["phases"]["skeleton"] == "built"
    batch = np.random.default_rng(6).random((4, 64), dtype=np.float32)
    np.testing.assert_array_equal(agent.infer("app", "mlp_m", batch), _answer(tiny_zoo, "mlp_m", batch))


def test_a_recovery_load_returns_after_its_first_answer_and_warms_up_after_the_reply(agent):
    assert agent._deferred.drain(30.0)
    described = agent.load("app", "digits_mlp", "mlp_s")
    phases = described["phases"]
    # the first answer before the route; the rest of the warm-up (max batch, batch 1) after it
    assert phases["warm_up_sizes"] == "1" and phases["warm_up_after_route"] == "8,1,8,1"
    left_at = phases["left_at"]
    assert agent._deferred.drain(30.0)
    deferred = agent.info()["deferred"]
    assert deferred["done"].get("warm_up") == 1 and deferred["failed"] == 0
    # it started after the load had returned its answer (the reply and the route go first)
    assert deferred["started_at"]["warm_up"] >= left_at
    queue = agent.queue_stats()["app/mlp_s"]
    assert queue["batches"] == 0  # warm-up inferences are no requests


def test_a_background_load_warms_up_in_full_before_it_returns(agent):
    assert agent._deferred.drain(30.0)
    before = dict(agent.info()["deferred"]["done"])
    phases = agent.load("app", "digits_mlp", "mlp_s", background=True)["phases"]
    assert phases["warm_up_sizes"] == "1,8,1,8,1" and phases["warm_up_after_route"] == ""
    assert agent._deferred.drain(30.0)
    assert agent.info()["deferred"]["done"].get("warm_up", 0) == before.get("warm_up", 0)


def test_the_deferred_warm_up_calibrates_the_queue_only_before_real_batches(agent):
    from failsoft.runtime.deferred import warm_rest

    agent.load("app", "digits_mlp", "mlp_s", background=True)
    held = agent._held[("app", "mlp_s")]
    assert held.queue.warmed([(1, 1.0), (1, 1.0)])  # no batch yet: applied
    agent.infer("app", "mlp_s", np.zeros((1, 64), dtype=np.float32))
    scale = held.queue.stats()["scale"]
    warm_rest(held.model, held.queue, (1, 1))  # a real batch calibrated it: the warm-up does not
    assert held.queue.stats()["scale"] == scale
    agent.unload("app", "mlp_s")
    warm_rest(held.model, held.queue, (1, 8))  # unloaded meanwhile: stops, raises nothing


def test_deferred_tasks_wait_for_recovery_loads_and_run_in_order():
    busy = threading.Event()
    busy.set()
    ran: list[tuple[str, float]] = []
    deferred = Deferred("t", busy.is_set, nice=0, settle_s=0.01, poll_s=0.005)
    deferred.submit("a", lambda: ran.append(("a", time.monotonic())))
    deferred.submit("b", lambda: 1 / 0)  # a failing task is counted, the thread goes on
    deferred.submit("c", lambda: ran.append(("c", time.monotonic())))
    time.sleep(0.1)
    assert ran == [] and deferred.stats()["pending"] == 3  # a recovery load runs: nothing starts
    released = time.monotonic()
    busy.clear()
    assert deferred.drain(10.0)
    assert [kind for kind, _ in ran] == ["a", "c"] and ran[0][1] >= released
    stats = deferred.stats()
    assert stats["done"] == {"a": 1, "c": 1} and stats["failed"] == 1 and stats["pending"] == 0
    deferred.close()
