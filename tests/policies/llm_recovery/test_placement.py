"""Checkpoint placement (Alg. 1, Eq. 5) and the checkpoint ledger's accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failsoft.errors import ConfigError
from failsoft.policies import registry
from failsoft.policies.llm_recovery import (
    CheckpointLedger,
    ClusterView,
    LoadAware,
    NoCheckpoint,
    RingNeighbour,
    WorkerLoad,
    recovery_load,
)
from failsoft.services import LlmParams

P = LlmParams(checkpoint_budget_mb=1000.0, alpha=1.0, beta=1.0)


def view(*workers: WorkerLoad) -> ClusterView:
    return ClusterView(workers)


def test_load_aware_prefers_the_lightest_peer_and_never_the_serving_worker():
    v = view(
        WorkerLoad("a", queue=0), WorkerLoad("b", queue=9), WorkerLoad("c", queue=2), WorkerLoad("d", queue=5)
    )
    assert LoadAware().choose("a", 100.0, v, P).holder == "c"  # a itself is the lightest
    assert LoadAware().choose("c", 100.0, v, P).holder == "a"


def test_load_aware_counts_held_kv_with_alpha_per_gb():
    # b has fewer requests but holds 8 GB of checkpoints: L(b) = 8 + 1 > L(c) = 0 + 4
    v = view(WorkerLoad("a"), WorkerLoad("b", queue=1, held_kv_mb=8 * 1024), WorkerLoad("c", queue=4))
    params = LlmParams(checkpoint_budget_mb=20 * 1024)
    assert LoadAware().choose("a", 10.0, v, params).holder == "c"
    # with alpha 0 only the queues count
    assert (
        LoadAware().choose("a", 10.0, v, LlmParams(checkpoint_budget_mb=20 * 1024, alpha=0.0)).holder == "b"
    )


def test_load_aware_skips_peers_without_budget_and_down_peers():
    v = view(
        WorkerLoad("a"),
        WorkerLoad("b", queue=0, held_kv_mb=950.0),  # lightest, but 100 MB more would pass 1000
        WorkerLoad("c", queue=1, alive=False),
        WorkerLoad("d", queue=1, serving=False),  # reloading
        WorkerLoad("e", queue=7),
    )
    assert LoadAware().choose("a", 100.0, v, P).holder == "e"
    assert LoadAware().choose("a", 50.0, v, P).holder == "b"  # exactly fills the budget


def test_no_peer_with_budget_means_no_checkpoint():
    v = view(WorkerLoad("a"), WorkerLoad("b", held_kv_mb=990.0))
    decision = LoadAware().choose("a", 100.0, v, P)
    assert decision.holder is None and "budget" in decision.reason


@pytest.mark.parametrize("placement", [LoadAware(), RingNeighbour(), NoCheckpoint()])
def test_a_budget_of_zero_means_no_checkpoint(placement):
    v = view(WorkerLoad("a"), WorkerLoad("b"))
    assert placement.choose("a", 0.0, v, LlmParams(checkpoint_budget_mb=0.0)).holder is None


def test_ring_takes_the_next_up_worker_without_looking_at_load():
    v = view(WorkerLoad("a"), WorkerLoad("b", queue=50), WorkerLoad("c", alive=False), WorkerLoad("d"))
    ring = RingNeighbour()
    assert ring.choose("a", 10.0, v, P).holder == "b"
    assert ring.choose("b", 10.0, v, P).holder == "d"  # c is down
    assert ring.choose("d", 10.0, v, P).holder == "a"  # wraps around
    full = view(WorkerLoad("a"), WorkerLoad("b", held_kv_mb=999.0), WorkerLoad("c"))
    assert ring.choose("a", 10.0, full, P).holder is None  # no fallback to c


@settings(max_examples=200, deadline=None)
@given(
    queues=st.lists(st.integers(0, 50), min_size=2, max_size=8),
    held=st.lists(st.floats(0, 1000), min_size=8, max_size=8),
    kv=st.floats(0, 400),
)
def test_load_aware_choice_fits_the_budget_and_is_a_minimum(queues, held, kv):
    workers = [WorkerLoad(f"w{i}", q, held[i]) for i, q in enumerate(queues)]
    v = ClusterView(tuple(workers))
    holder = LoadAware().choose("w0", kv, v, P).holder
    fitting = [w for w in workers[1:] if w.held_kv_mb + kv <= P.checkpoint_budget_mb]
    if not fitting:
        assert holder is None
        return
    chosen = v.get(holder)
    assert holder != "w0" and chosen.held_kv_mb + kv <= P.checkpoint_budget_mb
    assert recovery_load(chosen, P) == min(recovery_load(w, P) for w in fitting)


def test_ledger_grows_within_the_budget_and_frees_on_finish():
    ledger = CheckpointLedger(kv_mb_per_token=1.0, budget_mb=100.0)
    assert ledger.assign("r1", "a", "b", 40) is not None
    assert ledger.assign("r2", "c", "b", 30) is not None
    assert ledger.held_mb("b") == 70.0
    assert ledger.extend("r1", 60) == 60  # +20
    assert ledger.extend("r2", 80) == 40  # only 10 more fit: the prefix stops growing
    assert ledger.held_mb("b") == 100.0
    assert ledger.assign("r3", "a", "b", 1) is None  # full
    ledger.release("r1")
    assert ledger.held_mb("b") == 40.0
    ledger.release("r2")
    assert ledger.held_mb("b") == 0.0 and ledger.total_mb() == 0.0 and len(ledger) == 0


def test_ledger_loses_what_a_failed_holder_held():
    ledger = CheckpointLedger(1.0, 100.0)
    ledger.assign("r1", "a", "b", 10)
    ledger.assign("r2", "a", "c", 10)
    assert ledger.lose_holder("b") == ["r1"]
    assert ledger.get("r1") is None and ledger.held_mb("b") == 0.0 and ledger.held_mb("c") == 10.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("aex"), st.integers(0, 9), st.integers(0, 60)), max_size=60))
def test_ledger_accounting_never_leaks(ops):
    """Random assigns, extends and releases: each holder's held KV is the sum of its live
    checkpoints and within budget; releasing every request leaves nothing held."""
    ledger = CheckpointLedger(kv_mb_per_token=0.5, budget_mb=40.0)
    holders = ["h0", "h1", "h2"]
    for op, rid, tokens in ops:
        if op == "a" and ledger.get(rid) is None:
            ledger.assign(rid, "s", holders[rid % 3], tokens)
        elif op == "e":
            ledger.extend(rid, tokens)
        else:
            ledger.release(rid)
        for h in holders:
            live = [ledger.get(r) for r in range(10)]
            held = sum(c.kv_mb for c in live if c is not None and c.holder == h)
            assert ledger.held_mb(h) == pytest.approx(held)
            assert ledger.held_mb(h) <= 40.0 + 1e-9
    for rid in range(10):
        ledger.release(rid)
    assert ledger.total_mb() == 0.0 and len(ledger) == 0


def test_bad_input_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"checkpoint_budget_mb.*-1"):
        LlmParams(checkpoint_budget_mb=-1.0)
    with pytest.raises(ValueError, match=r"alpha.*-0.5"):
        LlmParams(alpha=-0.5)
    with pytest.raises(ConfigError, match=r"budget_mb.*-5"):
        CheckpointLedger(0.3, -5.0)
    with pytest.raises(ConfigError, match=r"queue.*-1"):
        WorkerLoad("a", queue=-1)
    with pytest.raises(ConfigError, match=r"kv_mb.*-2"):
        LoadAware().choose("a", -2.0, view(WorkerLoad("a"), WorkerLoad("b")), P)
    with pytest.raises(ConfigError, match=r"tokens.*-3"):
        CheckpointLedger(0.3, 10.0).assign("r", "a", "b", -3)
    with pytest.raises(ConfigError, match="repeat"):
        view(WorkerLoad("a"), WorkerLoad("a"))


def test_the_registry_names_every_policy():
    assert registry.names("llm_recovery") == [
        "fixed-checkpointing",
        "lumen",
        "lumen-no-load-aware",
        "lumen-no-locality",
        "lumen-no-progressive",
        "stop-and-restart",
    ]
    lumen = registry.make("llm_recovery", "lumen", LlmParams(theta=3.0))
    assert lumen.params.theta == 3.0 and lumen.checkpoints
    assert not registry.make("llm_recovery", "lumen", LlmParams(checkpoint_budget_mb=0.0)).checkpoints
    assert registry.make("llm_recovery", "stop-and-restart").progressive is None
