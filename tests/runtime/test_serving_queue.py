"""Serving queues with real threads: batching, cancellation, expiry, admission, unload racing inference.

Most tests serve a plain numpy function (a fixed linear map) through :class:`ServingQueue`, whose
``predict`` can be held on a gate, so that what is queued while a batch runs is exact. The agent tests
at the end load the real digits MLP of the tiny zoo into an in-process :class:`Agent`.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from failsoft.domain import Variant
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    DroppedError,
    ModelNotLoadedError,
    OverloadedError,
)
from failsoft.policies import registry
from failsoft.policies.queueing import ServiceModel, warmup_sizes
from failsoft.runtime.serving import ServingQueue, calibrated

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3)
PROFILE = Variant("m", 1.0, 0.9, 100.0, 50.0)  # 50 ms a row, as profiled
WAIT_S = 10.0  # generous bound on waits for threads: never reached when the code is right


class GatedModel:
    """``x @ WEIGHTS``; each call waits for the gate once ``hold`` is set. Refuses calls once closed,
    as a real model does."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.hold = True
        self.closed = False

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.closed:
            raise ConfigError("model is closed")
        self.calls.append(x.copy())
        self.entered.release()
        if self.hold:
            assert self.gate.wait(WAIT_S)
        if self.closed:
            raise ConfigError("model closed under a running batch")
        return x @ WEIGHTS

    def wait_running(self, n: int = 1) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=WAIT_S), "predict was not called"


def make_queue(model: GatedModel, discipline: str = "fifo", **settings) -> ServingQueue:
    max_batch, max_queue = settings.pop("max_batch", 8), settings.pop("max_queue", 256)
    queue = ServingQueue(
        "test",
        model.predict,
        (4,),
        registry.make("queueing", discipline, max_batch, max_queue),
        ServiceModel(PROFILE),
        learn=0.0,  # estimates stay the profile's: admission is exact
        margin_s=settings.pop("margin_s", 0.0),
        **settings,
    )
    return queue.start()


@pytest.fixture
def model() -> Iterator[GatedModel]:
    m = GatedModel()
    yield m
    m.gate.set()


def rows(n: int, start: float = 0.0) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) + start  # integers: exact in any batch


def in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def settle(queue: ServingQueue, queued: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while queue.stats()["queued"] != queued:
        assert time.monotonic() < deadline, f"queue never held {queued}"
        time.sleep(0.001)


# batching -----------------------------------------------------------------------------------------
def test_requests_queued_behind_a_batch_run_together_and_each_gets_its_own_rows(model):
    queue = make_queue(model)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()
    inputs = [rows(1, 100), rows(2, 200), rows(3, 300)]
    waiting = [in_thread(queue.infer, x, None) for x in inputs]
    settle(queue, 3)
    model.gate.set()
    for (thread, out), x in zip([first, *waiting], [rows(1), *inputs], strict=True):
        thread.join(WAIT_S)
        np.testing.assert_array_equal(out["value"], x @ WEIGHTS)
    assert [len(c) for c in model.calls] == [1, 6]  # one batch of the six queued rows
    stats = queue.stats()
    assert (stats["served"], stats["batches"], stats["rows"]) == (4, 2, 7)
    queue.close()


def test_a_batch_never_exceeds_max_batch_rows(model):
    queue = make_queue(model, max_batch=4)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()
    waiting = [in_thread(queue.infer, rows(1, i), None) for i in range(6)]
    settle(queue, 6)
    model.gate.set()
    for thread, _ in [first, *waiting]:
        thread.join(WAIT_S)
    assert [len(c) for c in model.calls] == [1, 4, 2]
    queue.close()


def test_a_malformed_batch_is_refused_before_it_reaches_anyone_elses(model):
    queue = make_queue(model)
    with pytest.raises(ConfigError, match=r"expects a batch of shape \(N, 4\), got \(1, 3\)"):
        queue.infer(np.zeros((1, 3)), None)
    with pytest.raises(ConfigError, match="dtype"):
        queue.infer(np.array([["a"] * 4]), None)
    assert model.calls == []
    queue.close()


# cancellation and deadlines --------------------------------------------------------------------------
def test_a_cancelled_request_leaves_the_queue_and_its_caller_at_once(model):
    queue = make_queue(model)
    first = in_thread(queue.infer, rows(1), None, "a")
    model.wait_running()
    thread, out = in_thread(queue.infer, rows(1, 5), None, "b")
    settle(queue, 1)
    assert queue.cancel("b") is True
    thread.join(WAIT_S)
    assert isinstance(out["error"], DeadlineExceededError) and "cancelled" in str(out["error"])
    assert queue.cancel("b") is False and queue.cancel("nobody") is False
    assert queue.cancel("a") is False  # running: it completes
    model.gate.set()
    first[0].join(WAIT_S)
    np.testing.assert_array_equal(first[1]["value"], rows(1) @ WEIGHTS)
    assert len(model.calls) == 1  # "b" never ran
    assert queue.stats()["cancelled"] == 1
    queue.close()


def test_a_request_whose_deadline_passes_in_the_queue_is_withdrawn_and_never_runs(model):
    queue = make_queue(model, max_batch=2)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="deadline"):
        queue.infer(rows(1, 5), 0.2)  # admitted: 50 + 100 ms (its batch of 2) estimated; held longer
    assert time.monotonic() - started >= 0.2
    model.gate.set()
    first[0].join(WAIT_S)
    assert len(model.calls) == 1 and queue.stats()["expired"] == 1
    queue.close()


def test_the_worker_drops_requests_past_their_deadline_at_dequeue(model):
    now = [100.0]
    queue = make_queue(model, clock=lambda: now[0])
    in_thread(queue.infer, rows(1), None)
    model.wait_running()
    late = in_thread(queue.infer, rows(1, 5), 1.0)  # deadline 101 on the queue's clock
    settle(queue, 1)
    now[0] = 102.0  # the batch ahead outlasted the deadline
    model.gate.set()
    late[0].join(WAIT_S)
    assert isinstance(late[1]["error"], DroppedError) and "dropped" in str(late[1]["error"])
    assert len(model.calls) == 1 and queue.stats()["dropped"] == 1
    queue.close()


def test_lazy_drop_drops_at_dequeue_what_can_no_longer_finish_in_time(model):
    now = [100.0]
    queue = make_queue(model, "batch-lazy-drop", clock=lambda: now[0])
    in_thread(queue.infer, rows(1), None)
    model.wait_running()
    tight = in_thread(queue.infer, rows(1, 5), 0.2)  # 50 ms left to run 50 ms, once the batch ahead ends
    settle(queue, 1)
    now[0] = 100.16  # 40 ms left: fifo would still run it, late
    model.gate.set()
    tight[0].join(WAIT_S)
    assert isinstance(tight[1]["error"], DroppedError) and "dropped" in str(tight[1]["error"])
    assert len(model.calls) == 1
    queue.close()


# admission -------------------------------------------------------------------------------------------
def test_admission_refuses_at_once_what_cannot_finish_in_time_with_when_to_retry(model):
    queue = make_queue(model, max_batch=1)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()  # running: estimated to end 50 ms after it started
    second = in_thread(queue.infer, rows(1, 1), 0.12)  # 50 + 50 ms: fits
    settle(queue, 1)
    with pytest.raises(OverloadedError, match="cannot finish before its deadline") as refused:
        queue.infer(rows(1, 2), 0.12)  # 50 + 50 + 50 ms: does not
    assert 0.05 < refused.value.retry_after_s <= 0.1  # when the running batch and the one ahead are done
    model.gate.set()
    for thread, _ in (first, second):
        thread.join(WAIT_S)
    assert queue.stats()["refused"] == 1 and len(model.calls) == 2
    queue.close()


def test_a_request_behind_a_running_batch_is_judged_in_the_full_batch_later_ones_will_fill(model):
    """Behind queued work, the batch a request joins takes whatever comes by then: a request is
    admitted only if that batch, grown, still meets its deadline. Judged by the one row it was, the
    request refused here was admitted, a later one joined its batch, and it was answered late."""
    now = [100.0]
    queue = make_queue(model, max_batch=2, clock=lambda: now[0])  # 50 ms a row: 100 ms for two
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()  # estimated to end at 100.05
    ahead = [in_thread(queue.infer, rows(1, 1 + i), None) for i in range(2)]  # a full batch: to 100.15
    settle(queue, 2)
    with pytest.raises(OverloadedError, match="cannot finish before its deadline"):
        queue.infer(rows(1, 5), 0.23)  # 100.15 + 50 ms fits alone, 100.15 + 100 ms does not
    now[0] = 100.04
    later = [in_thread(queue.infer, rows(1, 10 + i), 0.3) for i in range(2)]  # deadline 100.34
    settle(queue, 4)
    now[0] = 100.05
    model.gate.set()
    for (thread, out), i in zip([first, *ahead, *later], [0, 1, 2, 10, 11], strict=True):
        thread.join(WAIT_S)
        np.testing.assert_array_equal(out["value"], rows(1, i) @ WEIGHTS)
    assert [len(c) for c in model.calls] == [1, 2, 2] and queue.stats()["refused"] == 1
    queue.close()


def test_a_queue_plans_to_answer_a_margin_before_the_deadline(model):
    model.hold = False
    queue = make_queue(model, margin_s=0.03)
    with pytest.raises(OverloadedError):
        queue.infer(rows(1), 0.07)  # 50 ms to run, but the answer must be ready 30 ms early
    with pytest.raises(DroppedError, match="no time left"):  # the queue's verdict: not sickness
        queue.infer(rows(1), 0.03)
    np.testing.assert_array_equal(queue.infer(rows(1), 0.09), rows(1) @ WEIGHTS)
    queue.close()


def test_a_full_queue_refuses_even_requests_without_a_deadline(model):
    queue = make_queue(model, max_queue=2)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()
    waiting = [in_thread(queue.infer, rows(1, i), None) for i in range(2)]
    settle(queue, 2)
    with pytest.raises(OverloadedError, match="queue full") as refused:
        queue.infer(rows(1, 9), None)
    assert refused.value.retry_after_s > 0
    model.gate.set()
    for thread, _ in [first, *waiting]:
        thread.join(WAIT_S)
    queue.close()


def test_an_injected_slowdown_delays_each_batch_and_counts_in_admission(model):
    model.hold = False
    slow = [0.0]
    queue = make_queue(model, max_batch=1, delay_s=lambda: slow[0])
    slow[0] = 0.3
    started = time.monotonic()
    np.testing.assert_array_equal(queue.infer(rows(1), 5.0), rows(1) @ WEIGHTS)
    assert time.monotonic() - started >= 0.3
    assert queue.service.batch_s(1) == pytest.approx(0.35)
    with pytest.raises(OverloadedError):
        queue.infer(rows(1), 0.2)  # 300 ms delay + 50 ms: cannot make 200 ms
    queue.close()


def test_service_estimates_follow_the_measured_batches():
    fast = Variant("fast", 1.0, 0.9, 1.0, 1000.0)  # profiled at 1 s a row; numpy answers in microseconds
    queue = ServingQueue("t", lambda x: x, (4,), registry.make("queueing", "fifo"), ServiceModel(fast))
    queue.start()
    for _ in range(30):
        queue.infer(rows(1), None)
    assert queue.service.batch_s(1) < 0.01
    queue.close()


def test_an_estimate_past_every_deadline_is_checked_by_a_probe_and_comes_down():
    """Profiled at 1 s a row, answered in microseconds: every 0.5 s request is refused at first; an
    idle second later one is admitted to check, and the estimate learns from each until it admits
    on its own. (Without the probe, an estimate grown past every deadline refused all for good.)"""
    now = [0.0]
    slow = Variant("slow", 1.0, 0.9, 1.0, 1000.0)
    queue = ServingQueue(
        "t", lambda x: x, (4,), registry.make("queueing", "fifo"), ServiceModel(slow), clock=lambda: now[0]
    ).start()
    with pytest.raises(OverloadedError):
        queue.infer(rows(1), 0.5)
    probes = 0
    while True:
        try:
            queue.infer(rows(1), 0.5)  # admitted by the estimate: done
            break
        except OverloadedError:
            now[0] += 1.0  # idle past the probe time
            np.testing.assert_array_equal(queue.infer(rows(1), 0.5), rows(1))
            probes += 1
            assert probes < 30
    assert probes >= 1 and queue.service.batch_s(1) < 0.5
    queue.close()


# unload --------------------------------------------------------------------------------------------
# run_here: a lone request answered in the thread that queued it ----------------------------------
QUICK = Variant("q", 1.0, 0.9, 100.0, 1.0)  # 1 ms a row: under INLINE_MAX_S


def quick_queue(model: GatedModel, **settings) -> ServingQueue:
    discipline = registry.make("queueing", "fifo", 8, 256)
    return ServingQueue("quick", model.predict, (4,), discipline, ServiceModel(QUICK), learn=0.0, **settings)


def test_a_lone_request_to_a_quick_idle_model_runs_in_the_thread_that_queued_it(model):
    model.hold = False
    threads: list[threading.Thread] = []
    predict = model.predict
    queue = ServingQueue(
        "quick",
        lambda x: threads.append(threading.current_thread()) or predict(x),
        (4,),
        registry.make("queueing", "fifo", 8, 256),
        ServiceModel(QUICK),
        learn=0.0,
    ).start()
    ticket = queue.submit(rows(1), 5.0, "r1", wake=False)
    assert queue.run_here() is True
    assert ticket.future.done()  # answered before run_here returned: no other thread took part
    np.testing.assert_array_equal(ticket.future.result(), rows(1) @ WEIGHTS)
    assert threads == [threading.current_thread()]
    assert queue.run_here() is False  # nothing queued
    assert queue.stats()["served"] == 1
    queue.close()


def test_run_here_leaves_a_slow_model_or_a_busy_worker_its_work(model):
    queue = quick_queue(model, delay_s=lambda: 0.001).start()  # an injected slowdown: never inline
    first = queue.submit(rows(1), None, "r1", wake=False)
    assert queue.run_here() is False  # the worker was woken instead and runs it
    model.wait_running()
    second = queue.submit(rows(1, 100.0), None, "r2", wake=False)
    assert queue.run_here() is False  # the worker is busy: one batch at a time, r2 waits for it
    model.gate.set()
    np.testing.assert_array_equal(second.future.result(WAIT_S), rows(1, 100.0) @ WEIGHTS)
    np.testing.assert_array_equal(first.future.result(WAIT_S), rows(1) @ WEIGHTS)
    assert [len(c) for c in model.calls] == [1, 1]
    queue.close()


def test_while_run_here_runs_a_batch_the_worker_takes_none():
    """A batch running in run_here's caller keeps the worker out: the next batch starts after it."""
    model = GatedModel()
    queue = quick_queue(model).start()
    queue.submit(rows(1), None, "r1", wake=False)
    runner, out = in_thread(queue.run_here)
    model.wait_running()
    second = queue.submit(rows(1, 100.0), None, "r2")  # wakes the worker: it must wait
    time.sleep(0.05)
    assert len(model.calls) == 1 and not second.future.done()
    model.gate.set()
    runner.join(WAIT_S)
    assert out == {"value": True}
    np.testing.assert_array_equal(second.future.result(WAIT_S), rows(1, 100.0) @ WEIGHTS)
    queue.close()


def test_close_answers_queued_requests_model_not_loaded_and_lets_the_running_batch_finish(model):
    queue = make_queue(model)
    first = in_thread(queue.infer, rows(1), None)
    model.wait_running()
    queued = in_thread(queue.infer, rows(1, 5), None)
    settle(queue, 1)
    closing = in_thread(queue.close, WAIT_S)
    queued[0].join(WAIT_S)
    assert isinstance(queued[1]["error"], ModelNotLoadedError)
    assert closing[0].is_alive()  # close waits for the running batch ...
    model.gate.set()
    closing[0].join(WAIT_S)
    assert closing[1]["value"] is True
    first[0].join(WAIT_S)
    np.testing.assert_array_equal(first[1]["value"], rows(1) @ WEIGHTS)  # ... which answered right
    with pytest.raises(ModelNotLoadedError):
        queue.infer(rows(1), None)


def test_unload_racing_inference_gives_right_answers_or_model_not_loaded_only():
    outcomes: list[str] = []
    for _ in range(20):
        model = GatedModel()
        model.hold = False
        queue = make_queue(model, max_batch=4)

        def call(i: int, queue: ServingQueue = queue) -> str:
            x = rows(1, i)
            try:
                answer = queue.infer(x, 5.0)
            except ModelNotLoadedError:
                return "not loaded"
            assert np.array_equal(answer, x @ WEIGHTS), "a wrong answer"
            return "answer"

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(call, i) for i in range(40)]
            assert queue.close(WAIT_S)
            model.closed = True  # what Agent.unload does once close returns
            outcomes += [f.result() for f in futures]  # any other error is raised here
    assert set(outcomes) <= {"answer", "not loaded"} and "answer" in outcomes


# warm-up ---------------------------------------------------------------------------------------------
def test_warm_up_covers_batch_1_and_the_max_batch_within_its_budget():
    cheap = ServiceModel(Variant("c", 1.0, 0.9, 10.0, 1.0, batch_latency_ms=((1, 1.0), (8, 4.0))))
    assert warmup_sizes(cheap, 8, 200.0) == (1, 8, 1, 8, 1)
    costly = ServiceModel(Variant("x", 1.0, 0.9, 200.0, 90.0, batch_latency_ms=((1, 90.0), (8, 600.0))))
    assert warmup_sizes(costly, 8, 200.0) == (1, 1)  # a CPU cannot spend 600 ms at batch 8 on a load
    assert warmup_sizes(costly, 8, 10.0) == (1,)  # the first answer is always part of a load


def test_warm_up_calibrates_from_the_repeated_runs_only():
    service = ServiceModel(Variant("c", 1.0, 0.9, 10.0, 10.0, batch_latency_ms=((1, 10.0), (8, 40.0))))
    timings = [(1, 900.0), (8, 800.0), (1, 20.0), (8, 80.0), (1, 20.0)]  # first runs pay the set-up
    assert calibrated(service, timings).scale == pytest.approx(2.0)
    assert calibrated(service, [(1, 900.0)]) is service


# the agent (the `agent` fixture: tests/runtime/conftest.py) -------------------------------------------
@pytest.mark.runtime
def test_an_agent_serves_through_a_warm_queue_at_its_own_priority(agent, tiny_zoo):
    described = agent.load("app", "digits_mlp", "mlp_s")
    x = np.random.default_rng(0).random((3, 64), dtype=np.float32)
    direct = tiny_zoo.load("digits_mlp", "mlp_s", "cpu").predict(x)
    np.testing.assert_allclose(agent.infer("app", "mlp_s", x, 5.0, "r1"), direct, rtol=1e-5)
    (stats,) = agent.info()["queues"].values()
    assert stats["nice"] == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())  # not the load's +5
    assert (stats["discipline"], stats["max_batch"], stats["served"]) == ("fifo", 8, 1)
    assert described["load_ms"] > 0 and not math.isnan(stats["scale"])
    # the loading thread's CPU time is reported beside the wall time: a part of it, never more
    # (time.thread_time counts this thread only)
    assert 0 < described["load_cpu_ms"] <= described["load_ms"] + 1.0
    # ... and summed over every load (what recoveries cost the host, for the simulator's twin)
    assert agent.holdings()["loads_cpu_ms"] == pytest.approx(described["load_cpu_ms"], abs=1e-3)
    assert agent.cancel("r1") is False


@pytest.mark.runtime
def test_an_agent_unloading_under_inference_answers_right_or_model_not_loaded(agent, tiny_zoo):
    inputs = np.random.default_rng(1).random((4, 1, 64), dtype=np.float32)  # one per thread
    agent.load("app", "digits_mlp", "mlp_xs")
    expected = [agent.infer("app", "mlp_xs", x, 5.0) for x in inputs]
    stop = threading.Event()
    outcomes: list[str] = []

    def hammer(i: int) -> None:
        while not stop.is_set():
            try:
                answer = agent.infer("app", "mlp_xs", inputs[i], 5.0)
            except ModelNotLoadedError:
                outcomes.append("not loaded")
                continue
            except Exception as exc:  # a 400 or a 500 at the gateway
                outcomes.append(repr(exc))
                continue
            # batched with the other threads' rows: equal up to float rounding, never another row's
            outcomes.append("answer" if np.allclose(answer, expected[i], rtol=1e-4, atol=1e-4) else "wrong")

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for _ in range(10):
        assert agent.unload("app", "mlp_xs") is True
        agent.load("app", "digits_mlp", "mlp_xs")
    stop.set()
    for t in threads:
        t.join(WAIT_S)
    assert set(outcomes) == {"answer", "not loaded"}  # never a wrong answer, never another error
    held = agent.holdings()
    assert held["models"] == [["app", "mlp_xs"]]
    assert held["used_mb"] == pytest.approx(tiny_zoo.variant("digits_mlp", "mlp_xs").memory_mb)


@pytest.mark.runtime
def test_the_load_share_probe_meets_what_a_load_meets(agent):
    alone = agent.load_cpu_share(0.3)
    assert 0.0 < alone <= 1.05
    # a thread of the same process busy in Python (as inference is between its torch calls) takes
    # turns with the probe at the interpreter lock, whatever the probe's lower priority
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(200))

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        shared = agent.load_cpu_share(0.5)
    finally:
        stop.set()
        worker.join()
    # at most about half the lock: below 0.8 of what it got alone on a quiet host; on a busy one
    # (alone already low, other processes taking the cores) still no more than the lock leaves
    assert shared < max(0.8 * alone, 0.6), (shared, alone)
