"""Serving-queue disciplines on hand-made queues: exact batches, drops and refusals."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failsoft.domain import Variant
from failsoft.errors import UnknownNameError
from failsoft.policies import registry
from failsoft.policies.queueing import (
    MIN_RETRY_S,
    PROBE_S,
    BatchLazyDrop,
    Edf,
    Fifo,
    Queued,
    QueueDiscipline,
    QueueParams,
    ServiceModel,
)

# A measured batch profile: 10 ms for one row, 12 for two, 16 for four, 24 for eight.
VARIANT = Variant("v", 10.0, 0.9, 100.0, 10.0, batch_latency_ms=((1, 10.0), (2, 12.0), (4, 16.0), (8, 24.0)))
SERVICE = ServiceModel(VARIANT)
INF = math.inf


def q(name: str, arrival: float = 0.0, deadline: float = INF, rows: int = 1) -> Queued:
    return Queued(name, arrival, deadline, rows)


def keys(items) -> list[str]:
    return [i.key for i in items]


def test_service_time_is_the_measured_profile_scaled_plus_overhead():
    assert SERVICE.batch_s(3) == pytest.approx(0.014)  # between the measured 2 and 4
    assert ServiceModel(VARIANT, scale=2.0, overhead_ms=5.0).batch_s(4) == pytest.approx(0.037)
    plain = ServiceModel(Variant("p", 1.0, 0.5, 1.0, 10.0), batch_cost=0.5)  # no profile: the formula
    assert plain.batch_s(3) == pytest.approx(0.020)
    with pytest.raises(ValueError, match="scale must be > 0"):
        ServiceModel(VARIANT, scale=0.0)


# fifo -----------------------------------------------------------------------------------------------
def test_fifo_takes_up_to_max_batch_rows_in_arrival_order():
    queue = [q(n, i * 0.001) for i, n in enumerate("abcde")]
    batch = Fifo(max_batch=4).next_batch(queue, 0.01, SERVICE)
    assert keys(batch.run) == list("abcd") and batch.drop == () and batch.rows == 4


def test_fifo_stops_at_a_request_that_does_not_fit_and_runs_an_oversized_one_alone():
    fifo = Fifo(max_batch=4)
    assert keys(fifo.next_batch([q("a", rows=2), q("b", rows=3), q("c")], 0.0, SERVICE).run) == ["a"]
    assert keys(fifo.next_batch([q("big", rows=9), q("c")], 0.0, SERVICE).run) == ["big"]


def test_fifo_drops_only_requests_already_past_their_deadline():
    queue = [q("expired", deadline=0.5), q("tight", deadline=1.005), q("easy")]
    batch = Fifo(max_batch=8).next_batch(queue, 1.0, SERVICE)
    assert keys(batch.drop) == ["expired"]
    assert keys(batch.run) == ["tight", "easy"]  # tight will be late, but fifo does not predict


def test_an_empty_queue_gives_an_empty_batch():
    assert Fifo().next_batch([], 0.0, SERVICE).run == ()


# batch-lazy-drop -----------------------------------------------------------------------------------
def test_lazy_drop_drops_a_request_that_cannot_finish_even_alone():
    queue = [q("hopeless", deadline=1.009), q("ok", deadline=1.010)]
    batch = BatchLazyDrop(max_batch=8).next_batch(queue, 1.0, SERVICE)
    assert keys(batch.drop) == ["hopeless"] and keys(batch.run) == ["ok"]


def test_lazy_drop_stops_growing_a_batch_before_a_member_would_miss_its_deadline():
    # one row 10 ms, two 12 ms, three 14 ms: "a" (deadline +13 ms) allows a batch of two only
    queue = [q("a", deadline=0.013), q("b"), q("c"), q("d")]
    batch = BatchLazyDrop(max_batch=8).next_batch(queue, 0.0, SERVICE)
    assert keys(batch.run) == ["a", "b"] and batch.drop == ()
    # "c" would make the batch too slow for itself: it waits for the next batch
    queue = [q("a"), q("b"), q("c", deadline=0.0135), q("d")]
    batch = BatchLazyDrop(max_batch=8).next_batch(queue, 0.0, SERVICE)
    assert keys(batch.run) == ["a", "b"] and batch.drop == ()


def test_lazy_drop_drops_hopeless_requests_as_they_come_up_and_batches_the_rest():
    queue = [q("late1", deadline=0.005), q("a"), q("late2", deadline=0.001), q("b"), q("c")]
    batch = BatchLazyDrop(max_batch=2).next_batch(queue, 0.0, SERVICE)
    assert keys(batch.drop) == ["late1", "late2"] and keys(batch.run) == ["a", "b"]


def test_lazy_drop_uses_the_calibrated_service_time():
    queue = [q("a", deadline=0.015)]
    assert keys(BatchLazyDrop().next_batch(queue, 0.0, SERVICE).run) == ["a"]
    slow = ServiceModel(VARIANT, overhead_ms=10.0)  # e.g. chaos slow: every batch 10 ms longer
    assert keys(BatchLazyDrop().next_batch(queue, 0.0, slow).drop) == ["a"]


# edf ------------------------------------------------------------------------------------------------
def test_edf_serves_earliest_deadlines_first_ties_by_arrival():
    queue = [q("late", 0.0, 5.0), q("soon", 0.1, 1.0), q("tie1", 0.2, 2.0), q("tie2", 0.3, 2.0)]
    batch = Edf(max_batch=3).next_batch(queue, 0.0, SERVICE)
    assert keys(batch.run) == ["soon", "tie1", "tie2"]


def test_edf_lazily_drops_like_batch_lazy_drop():
    queue = [q("a", deadline=2.0), q("hopeless", deadline=1.002)]
    batch = Edf().next_batch(queue, 1.0, SERVICE)
    assert keys(batch.drop) == ["hopeless"] and keys(batch.run) == ["a"]


# admission -----------------------------------------------------------------------------------------
def test_an_idle_queue_admits_and_estimates_one_batch():
    admission = Fifo().admit([], q("new", deadline=1.0), 0.0, 0.0, SERVICE)
    assert admission.admitted and admission.finish_s == pytest.approx(0.010)


def test_admission_counts_the_running_batch_and_the_work_ahead_in_full_batches():
    fifo = Fifo(max_batch=4)
    queue = [q(f"r{i}") for i in range(8)]  # two full batches of four ahead: 16 ms each
    new = q("new", deadline=1.0)
    admission = fifo.admit(queue, new, 1.0 - 0.5, 0.5 + 0.02, SERVICE)  # busy for 20 ms more
    assert admission.admitted  # its own batch costed full: later requests will join it
    assert admission.finish_s == pytest.approx(0.52 + 0.016 + 0.016 + 0.016)


def test_a_request_that_will_wait_is_costed_in_the_full_batch_it_will_run_in():
    """Behind a running batch, fifo's next batch takes whatever has come by then: the request's
    estimate is that full batch (24 ms at eight rows), not the lone row it is now (10 ms)."""
    new = q("new", deadline=1.0)
    assert Fifo().admit([], new, 0.0, 0.0, SERVICE).finish_s == pytest.approx(0.010)  # runs at once
    assert Fifo().admit([], new, 0.0, 0.005, SERVICE).finish_s == pytest.approx(0.005 + 0.024)
    overran = Fifo().admit([], new, 0.0, -0.001, SERVICE, running=True)  # past its estimate: still busy
    assert overran.finish_s == pytest.approx(0.024)
    two = Fifo().admit([q("a")], new, 0.0, 0.0, SERVICE)  # one queued: the worker takes both, or more
    assert two.finish_s == pytest.approx(0.024)
    tight = q("tight", deadline=0.05)  # would make it alone (40 ms), not in the batch it will run in
    refused = Fifo().admit([], tight, 0.0, 0.03, SERVICE)
    assert not refused.admitted and refused.retry_after_s == pytest.approx(0.03)
    for lazy in (BatchLazyDrop(), Edf()):  # a lazy batch never grows past a member's deadline
        assert lazy.admit([], tight, 0.0, 0.03, SERVICE).finish_s == pytest.approx(0.04)


def test_a_batch_is_grown_only_as_far_as_half_the_time_to_the_deadline_allows():
    """Where a full batch would take more than the deadline leaves, the request is costed in the
    largest batch that takes half of it (here 3 rows, 14 ms of 30), so a slow host or a large
    max_batch does not refuse everything behind a running batch."""
    fifo = Fifo(max_batch=8)
    assert fifo.reserve_rows(math.inf, SERVICE) == 8 and fifo.reserve_rows(0.048, SERVICE) == 8
    assert fifo.reserve_rows(0.030, SERVICE) == 3 and fifo.reserve_rows(0.005, SERVICE) == 1
    admission = fifo.admit([], q("new", deadline=0.030), 0.0, 0.002, SERVICE)
    assert admission.admitted and admission.finish_s == pytest.approx(0.002 + 0.014)


def test_a_request_that_would_make_its_batch_mates_late_is_refused():
    fifo = Fifo(max_batch=8)
    mate = q("mate", deadline=0.014)  # admitted alone behind the running batch: 2 + 10 ms (+10%)
    assert fifo.admit([], mate, 0.0, 0.002, SERVICE).admitted
    late = fifo.admit([mate], q("new", deadline=1.0), 0.0, 0.002, SERVICE)  # 2 + 12 ms (+10%): late
    assert not late.admitted and "late" in late.reason
    other = q("other", deadline=1.0)  # a batch mate with time to spare does not mind
    assert fifo.admit([other], q("new", deadline=1.0), 0.0, 0.002, SERVICE).admitted


def test_a_request_that_cannot_finish_in_time_is_refused_with_when_to_retry():
    fifo = Fifo(max_batch=4)
    queue = [q(f"r{i}") for i in range(8)]
    admission = fifo.admit(queue, q("new", deadline=0.55), 0.5, 0.52, SERVICE)
    assert not admission.admitted
    assert admission.retry_after_s == pytest.approx(0.02 + 0.032)  # the running batch, then 8 ahead
    assert "deadline" in admission.reason and "8 queued ahead" in admission.reason


def test_a_full_queue_refuses_until_its_next_batch_is_done():
    fifo = Fifo(max_batch=4, max_queue=8)
    queue = [q(f"r{i}") for i in range(8)]
    admission = fifo.admit(queue, q("new"), 0.0, 0.0, SERVICE)  # no deadline: only the bound refuses
    assert not admission.admitted and "queue full" in admission.reason
    assert admission.retry_after_s == pytest.approx(0.016)


def test_admission_keeps_a_share_of_the_predicted_time_as_slack():
    fifo = Fifo(max_batch=1)
    queue = [q(f"r{i}") for i in range(9)]  # 9 x 10 ms ahead: finishes at 100 ms, plus 10 ms margin
    assert fifo.wait_margin == 0.1
    refused = fifo.admit(queue, q("new", deadline=0.105), 0.0, 0.0, SERVICE)
    assert not refused.admitted and "5 ms late" in refused.reason
    assert fifo.admit(queue, q("new", deadline=0.111), 0.0, 0.0, SERVICE).admitted
    assert (
        Fifo(max_batch=1, wait_margin=0.0).admit(queue, q("new", deadline=0.105), 0.0, 0.0, SERVICE).admitted
    )
    with pytest.raises(ValueError, match="wait_margin"):
        Fifo(wait_margin=1.0)


def test_a_queue_idle_past_the_probe_time_admits_what_its_estimate_refuses():
    """The estimate is learned from batches run: one that refuses everything must be checked."""
    late = q("new", deadline=0.001)  # needs 10 ms
    assert not Fifo().admit([], late, 0.0, 0.0, SERVICE, idle_s=PROBE_S - 0.01).admitted
    assert Fifo().admit([], late, 0.0, 0.0, SERVICE, idle_s=PROBE_S).admitted
    busy = Fifo().admit([], late, 0.0, 0.005, SERVICE, idle_s=PROBE_S)  # a batch runs: no probe
    assert not busy.admitted


def test_an_idle_refusal_still_says_to_wait_a_little():
    admission = Fifo().admit([], q("new", deadline=0.001), 0.0, 0.0, SERVICE)  # needs 10 ms
    assert not admission.admitted and admission.retry_after_s == MIN_RETRY_S


def test_edf_admits_an_urgent_request_ahead_of_later_deadlines_where_fifo_refuses():
    queue = [q(f"r{i}", deadline=10.0) for i in range(16)]
    urgent = q("urgent", deadline=0.015)
    assert not Fifo(max_batch=8).admit(queue, urgent, 0.0, 0.0, SERVICE).admitted
    admission = Edf(max_batch=8).admit(queue, urgent, 0.0, 0.0, SERVICE)
    assert admission.admitted and admission.finish_s == pytest.approx(0.010)


# a closed-loop crowd on a virtual clock -------------------------------------------------------------
LINEAR = ServiceModel(Variant("lin", 10.0, 0.9, 100.0, 10.0))  # 10 ms a row: batching saves nothing


def crowd(
    discipline: QueueDiscipline, clients: int, deadline_s: float, seconds: float, overrun: float = 0.0
) -> dict:
    """``clients`` closed-loop clients against one queue and its worker, on a 1 ms virtual clock:
    each sends its next request (deadline ``deadline_s`` ahead) when the last one is answered,
    dropped or refused (then, at once: the hardest case). Each batch takes its estimated time, or up
    to ``overrun`` (a share) longer, drawn with a fixed seed: a host busier than the estimate knew.
    What happened."""
    rng = random.Random(7)
    now, step = 0.0, 0.001
    queue: list[Queued] = []
    running: tuple[float, tuple[Queued, ...]] | None = None
    ready, late, answered, refused, batches = set(range(clients)), 0, 0, 0, []
    while now < seconds:
        if running is not None and running[0] <= now + 1e-9:
            for item in running[1]:
                late += running[0] > item.deadline_s + 1e-9
                answered += 1
                ready.add(item.key)
            running = None
        if running is None and queue:
            batch = discipline.next_batch(queue, now, LINEAR)
            taken = {id(item) for item in (*batch.run, *batch.drop)}
            queue = [item for item in queue if id(item) not in taken]
            ready.update(item.key for item in batch.drop)
            if batch.run:
                took = LINEAR.batch_s(batch.rows) * (1.0 + rng.uniform(0.0, overrun))
                running = (round(now + took, 3), batch.run)  # on the 1 ms clock
                batches.append(batch.rows)
        for client in sorted(ready):
            item = Queued(client, now, now + deadline_s)
            free_at = running[0] if running is not None else now
            if discipline.admit(queue, item, now, free_at, LINEAR, running=running is not None).admitted:
                queue.append(item)
                ready.discard(client)
            else:
                refused += 1
        now = round(now + step, 9)
    return {"late": late, "answered": answered, "refused": refused, "rows": sum(batches) / len(batches)}


def test_a_crowd_past_capacity_is_answered_in_time_in_full_batches_and_the_rest_refused():
    """32 clients, each asking again at once, against a queue that answers 100 rows/s: what it
    admits it answers before the deadline, in full batches of eight, at its full rate. (Costing a
    request's batch as it stood when the request came, 7 of every 8 answers were late: each new
    batch was opened by a request admitted with no slack, then filled by seven more.)"""
    out = crowd(Fifo(max_batch=8), clients=32, deadline_s=0.2, seconds=3.0)
    assert out["late"] == 0, out
    assert out["rows"] > 7.5 and out["answered"] >= 0.95 * 3.0 * 100, out  # full batches, full rate
    assert out["refused"] > 0, out


def test_batches_that_run_longer_than_estimated_make_nobody_late_within_the_wait_margin():
    """Every request of a crowd is admitted at the edge: with no slack kept, batches up to 8% slower
    than estimated made answers late; a tenth of the predicted wait kept as slack absorbs that."""
    noisy = crowd(Fifo(max_batch=8), clients=32, deadline_s=0.25, seconds=3.0, overrun=0.08)
    assert noisy["late"] == 0 and noisy["rows"] > 7.5, noisy
    exact = crowd(Fifo(max_batch=8, wait_margin=0.0), clients=32, deadline_s=0.25, seconds=3.0, overrun=0.08)
    assert exact["late"] > 10, exact


# invariants over random queues -----------------------------------------------------------------------
ITEMS = st.lists(
    st.tuples(st.floats(0.0, 0.1), st.one_of(st.just(INF), st.floats(0.0, 0.2)), st.integers(1, 10)),
    max_size=30,
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(ITEMS, st.integers(1, 16), st.sampled_from(["fifo", "batch-lazy-drop", "edf"]), st.floats(0.0, 0.1))
def test_every_batch_respects_its_bounds(items, max_batch, name, now):
    queue = [Queued(i, arrival, deadline, rows) for i, (arrival, deadline, rows) in enumerate(items)]
    discipline: QueueDiscipline = registry.make("queueing", name, max_batch, None)
    batch = discipline.next_batch(queue, now, SERVICE)
    run, drop = {i.key for i in batch.run}, {i.key for i in batch.drop}
    assert not run & drop and (run or drop or not queue)
    assert batch.rows <= max_batch or len(batch.run) == 1
    for item in batch.drop:
        assert discipline.hopeless(item, now, SERVICE)
    if discipline.lazy_drop and batch.run:
        finish = now + SERVICE.batch_s(batch.rows)
        assert all(finish <= item.deadline_s for item in batch.run)  # nobody run to be late
    elif batch.run:
        assert all(now < item.deadline_s for item in batch.run)


# the registry and the settings ----------------------------------------------------------------------
def test_the_three_disciplines_are_registered_with_their_settings():
    assert registry.names("queueing") == ["batch-lazy-drop", "edf", "fifo"]
    made = registry.make("queueing", "edf", 4, 32)
    assert isinstance(made, Edf) and (made.max_batch, made.max_queue) == (4, 32)
    params = QueueParams("batch-lazy-drop", 16, 64)
    built = registry.policy_class("queueing", params.discipline).from_params(params)
    assert isinstance(built, BatchLazyDrop) and (built.max_batch, built.max_queue) == (16, 64)
    with pytest.raises(UnknownNameError, match=r"unknown queueing policy 'lifo'.*fifo"):
        registry.make("queueing", "lifo")


@pytest.mark.parametrize(("field", "value"), [("max_batch", 0), ("max_batch", 65), ("max_queue", 0)])
def test_queue_settings_out_of_bounds_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"QueueParams.{field} must be .*; got {value}"):
        QueueParams(**{field: value})
    if field == "max_batch":
        with pytest.raises(ValueError, match=f"max_batch must be in 1..64; got {value}"):
            Fifo(max_batch=value)
