"""Coding groups on explicit times: arrival order, fill timeout, first k of k+r, stragglers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failsoft.errors import ConfigError
from failsoft.policies.coding.groups import AnswerTracker, GroupFormer, Slot
from failsoft.policies.registry import get_decoder


def test_queries_fill_groups_of_k_in_arrival_order():
    former = GroupFormer(k=3, fill_timeout_ms=10)
    slots = []
    for i, t in enumerate([0.0, 0.001, 0.002, 0.003]):
        slot, closed = former.join(f"q{i}", t)
        slots.append(slot)
        if i < 2:
            assert closed == ()
        if i == 2:
            (group,) = closed
            assert group.complete and group.keys == ("q0", "q1", "q2") and group.closed_s == 0.002
    assert slots == [Slot(0, 0), Slot(0, 1), Slot(0, 2), Slot(1, 0)]
    assert former.waiting == 1


def test_a_group_that_waits_past_the_fill_timeout_is_released_uncoded():
    former = GroupFormer(k=2, fill_timeout_ms=10)
    former.join("lone", 1.0)
    assert former.next_timeout_s() == pytest.approx(1.010)
    assert former.poll(1.0099) == ()
    (group,) = former.poll(1.010)
    assert not group.complete and group.keys == ("lone",) and group.opened_s == 1.0
    assert former.next_timeout_s() is None and former.waiting == 0


def test_a_late_arrival_releases_the_timed_out_group_and_opens_a_new_one():
    former = GroupFormer(k=2, fill_timeout_ms=5)
    former.join("a", 0.0)
    slot, closed = former.join("b", 0.006)
    assert [(g.keys, g.complete) for g in closed] == [(("a",), False)]
    assert slot == Slot(1, 0)
    slot, closed = former.join("c", 0.007)
    assert slot == Slot(1, 1) and [(g.keys, g.complete) for g in closed] == [(("b", "c"), True)]


def test_queries_of_different_shapes_are_never_coded_together():
    former = GroupFormer(k=2, fill_timeout_ms=10)
    former.join("row", 0.0, shape=(1, 64))
    _, closed = former.join("batch", 0.001, shape=(4, 64))
    assert closed == ()
    _, closed = former.join("row2", 0.002, shape=(1, 64))
    assert [g.keys for g in closed] == [("row", "row2")]
    assert [g.keys for g in former.flush(0.003)] == [("batch",)]


def test_former_refuses_bad_parameters():
    with pytest.raises(ConfigError, match="got 0"):
        GroupFormer(k=2, fill_timeout_ms=0)
    with pytest.raises(ConfigError, match=r"k must be .* got 5"):
        GroupFormer(k=5, fill_timeout_ms=10)


def outputs(k: int, r: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    data = [rng.normal(size=10).astype(np.float32) for _ in range(k)]
    g = get_decoder(k, r).coefficients
    return data + [sum(g[p, i] * data[i] for i in range(k)) for p in range(r)]


def test_first_k_of_k_plus_1_decodes_the_straggler_and_cancels_it():
    outs = outputs(2, 1)
    tracker = AnswerTracker(get_decoder(2, 1))
    assert tracker.answered(0, outs[0]).decoded == {}
    progress = tracker.answered(2, outs[2])
    assert progress.done and progress.cancel == (1,)
    np.testing.assert_allclose(progress.decoded[1], outs[1], atol=1e-5)
    assert tracker.answered(1, outs[1]) == type(progress)(done=True)  # a late original changes nothing


def test_the_decoder_runs_only_once_k_answers_are_present_and_decodes_exactly():
    class Counting(type(get_decoder(3, 2))):  # the registry's linear decoder, counting its calls
        calls = 0

        def solve(self, available, missing):  # the tracker's entry: checked answers, k present
            Counting.calls += 1
            return super().solve(available, missing)

    outs = outputs(3, 2)
    tracker = AnswerTracker(Counting(3, 2))
    assert tracker.answered(np.int64(4), outs[4]).decoded == {}  # numpy integers are member indices too
    assert tracker.answered(1, outs[1]).decoded == {} and Counting.calls == 0
    progress = tracker.answered(3, outs[3])  # the third answer of k = 3: members 0 and 2 decoded
    assert Counting.calls == 1 and progress.done and progress.cancel == (0, 2)
    for j in (0, 2):
        np.testing.assert_allclose(progress.decoded[j], outs[j], atol=1e-4)
    with pytest.raises(ConfigError, match="got True"):
        AnswerTracker(Counting(3, 2)).answered(True, outs[0])  # type: ignore[arg-type]


def test_all_data_answers_first_cancel_the_parity():
    outs = outputs(3, 1)
    tracker = AnswerTracker(get_decoder(3, 1))
    for i in (2, 0):
        assert not tracker.answered(i, outs[i]).done
    progress = tracker.answered(1, outs[1])
    assert progress.done and progress.cancel == (3,) and progress.decoded == {}


def test_with_fewer_than_k_answers_nothing_is_decoded():
    outs = outputs(3, 1)
    tracker = AnswerTracker(get_decoder(3, 1))
    assert tracker.answered(3, outs[3]).decoded == {}
    assert tracker.answered(0, outs[0]).decoded == {}
    assert not tracker.done and tracker.pending == (1, 2)


def test_two_lost_members_are_decoded_from_two_parities():
    outs = outputs(2, 2)
    tracker = AnswerTracker(get_decoder(2, 2))
    tracker.failed(0)
    tracker.answered(3, outs[3])
    tracker.failed(1)
    progress = tracker.answered(2, outs[2])
    assert progress.done and set(progress.decoded) == {0, 1}
    for j in (0, 1):
        np.testing.assert_allclose(progress.decoded[j], outs[j], atol=1e-4)


def test_too_many_losses_are_unrecoverable_and_cancel_the_parities():
    outs = outputs(3, 2)
    tracker = AnswerTracker(get_decoder(3, 2))
    tracker.answered(0, outs[0])
    tracker.failed(1)
    tracker.failed(3)
    progress = tracker.failed(4)
    assert progress.done and progress.unrecoverable == (1,) and progress.cancel == ()
    with pytest.raises(ConfigError, match="got 5"):
        tracker.answered(5, outs[0])


@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(2, 4),
    gaps_ms=st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=40),
    timeout_ms=st.floats(1, 20),
    fill=st.sampled_from(["fixed", "rate"]),
)
def test_every_query_lands_in_one_group_in_arrival_order_and_none_waits_past_the_timeout(
    k, gaps_ms, timeout_ms, fill
):
    """Driven as a gateway would (poll at each due timeout, join on each arrival): each query is in
    exactly one group, groups keep arrival order, complete ones hold k, and no group is released
    later than its fill timeout (the cap, under either fill policy)."""
    former = GroupFormer(k, timeout_ms, fill)
    closed: list = []
    now = 0.0
    for key, gap in enumerate(gaps_ms):
        arrival = now + gap / 1000
        while (due := former.next_timeout_s()) is not None and due <= arrival:
            closed += former.poll(due)
        now = arrival
        slot, done = former.join(key, now)
        closed += done
        assert slot.index < k
    closed += former.flush(now)
    assert [key for g in closed for key in g.keys] == list(range(len(gaps_ms)))
    for g in closed:
        assert g.complete == (len(g.keys) == k) and 1 <= len(g.keys) <= k
        assert g.closed_s - g.opened_s <= timeout_ms / 1000 + 1e-9


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_tracker_decodes_each_straggler_exactly_as_the_decoder_does(k):
    outs = outputs(k, 1)
    for straggler in range(k):
        tracker = AnswerTracker(get_decoder(k, 1))
        for i in [k] + [i for i in range(k) if i != straggler]:  # parity first, the straggler never
            progress = tracker.answered(i, outs[i])
        (got,) = progress.decoded.values()
        assert list(progress.decoded) == [straggler] and got.dtype == np.float32
        assert progress.cancel == (straggler,)
        want = get_decoder(k, 1).decode({i: o for i, o in enumerate(outs) if i != straggler})
        np.testing.assert_array_equal(got, want[straggler])
        np.testing.assert_allclose(got, outs[straggler], atol=1e-5)


def test_the_tracker_refuses_an_answer_of_another_shape_naming_both():
    tracker = AnswerTracker(get_decoder(2, 1))
    tracker.answered(0, np.zeros((1, 10), np.float32))
    with pytest.raises(ConfigError, match=r"member 2 has shape \(1, 9\); others have \(1, 10\)"):
        tracker.answered(2, np.zeros((1, 9), np.float32))
    assert not tracker.done and tracker.pending == (1, 2)
