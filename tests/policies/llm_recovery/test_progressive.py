"""Progressive recovery decisions (Alg. 3) and the speculative-decoding arithmetic (Eq. 3)."""

from __future__ import annotations

import pytest

from failsoft.errors import ConfigError
from failsoft.policies.llm_recovery import (
    ClusterView,
    ProgressiveRecovery,
    Recovering,
    SpeculationCost,
    WorkerLoad,
    expected_tokens,
)
from failsoft.services import LlmParams

VIEW = ClusterView(
    (WorkerLoad("a", 5), WorkerLoad("b", 30), WorkerLoad("c", 12), WorkerLoad("x", alive=False))
)
P = LlmParams(draft_tokens=2)


def test_expected_tokens_matches_the_review_example():
    assert expected_tokens(0.8, 4) == pytest.approx(3.36, abs=0.01)  # "about 3.4 tokens per step"
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


def test_a_worker_with_its_draft_assists_the_most_loaded_survivor():
    decisions = ProgressiveRecovery().decide(
        [Recovering("x", draft_ready=True), Recovering("y", draft_ready=True)], VIEW, P, SpeculationCost()
    )
    assert [(d.mode, d.assist) for d in decisions] == [("peer-verify", "b"), ("peer-verify", "c")]
    assert decisions[0].speedup > 1


def test_nothing_loaded_means_loading():
    (d,) = ProgressiveRecovery().decide([Recovering("x")], VIEW, P, SpeculationCost())
    assert d.mode == "loading" and d.assist is None


def test_a_useless_draft_is_not_used():
    (d,) = ProgressiveRecovery().decide([Recovering("x", True)], VIEW, P, SpeculationCost(acceptance=0.0))
    assert d.mode == "idle" and "gains" in d.reason


def test_after_the_target_is_back_self_drafting_only_when_it_pays():
    decide = ProgressiveRecovery().decide
    (plain,) = decide(
        [Recovering("x", True, True)], VIEW, P, SpeculationCost(acceptance=0.6, draft_step=0.386)
    )
    assert plain.mode == "full"  # measured 7B/70B step ratio: speculation on one GPU gains < 1.2x
    (cheap,) = decide(
        [Recovering("x", True, True)], VIEW, P, SpeculationCost(acceptance=0.8, draft_step=0.05)
    )
    assert cheap.mode == "self-draft" and cheap.speedup >= 1.2


def test_peer_assist_pipelines_and_beats_self_drafting():
    cost = SpeculationCost(acceptance=0.6, draft_step=0.386)
    assert cost.peer_speedup(2) > cost.self_speedup(2)
    assert cost.peer_speedup(2) == pytest.approx(expected_tokens(0.6, 2) / 1.0)


def test_bad_speculation_inputs_are_refused():
    with pytest.raises(ConfigError, match=r"acceptance.*1.5"):
        SpeculationCost(acceptance=1.5)
    with pytest.raises(ConfigError, match=r"draft_tokens.*0"):
        expected_tokens(0.5, 0)
    with pytest.raises(ValueError, match=r"draft_tokens.*0"):
        LlmParams(draft_tokens=0)
