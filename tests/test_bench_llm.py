"""``bench llm``'s trace: the conversation trace rescaled to a model's context (no cluster here;
the bench itself runs in docs/lumen.md)."""

from __future__ import annotations

import pytest


def test_trace_is_rescaled_to_the_context_and_rate() -> None:
    from failsoft.bench.llm import trace

    reqs = trace(50, rate_rps=10.0, context=256, seed=0)
    assert len(reqs) == 50
    arrivals = [a for a, _, _ in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert arrivals[-1] == pytest.approx(5.0)  # 50 requests at a mean 10 per second
    for _, prompt, max_tokens in reqs:
        assert 1 <= len(prompt.encode()) <= 128 and 8 <= max_tokens <= 127
        assert len(prompt.encode()) + max_tokens <= 256
    assert trace(50, 10.0, 256, seed=0) == reqs  # seeded
    assert len({m for _, _, m in reqs}) > 5  # the trace's spread of lengths is kept


def test_recovery_is_the_later_of_the_restart_and_the_interrupted_streams() -> None:
    from failsoft.bench.llm import _Outcome, recovery

    kill = 100.0
    resumed = _Outcome(recoveries=1, times=[99.5, 100.8, 100.9])  # interrupted, next token 0.8 s later
    untouched = _Outcome(times=[99.0, 103.0])  # never interrupted: not a stream to recover
    broken = _Outcome(recoveries=1, times=[99.9, 104.0], error="stream broke")
    assert recovery([resumed, untouched, broken], kill, 5342.0) == {
        "recovery_ms": 5342.0,
        "streams_ms": 800.0,
        "recovery_bound_by": "restart",
    }
    assert recovery([resumed], kill, 300.0)["recovery_bound_by"] == "streams"
    assert recovery([resumed], kill, 300.0)["recovery_ms"] == 800.0
    assert recovery([untouched], kill, None) == {
        "recovery_ms": 0.0,
        "streams_ms": None,
        "recovery_bound_by": "restart",
    }


def test_impact_ttft_is_the_requests_sent_after_the_kill_and_the_interrupted_replays() -> None:
    from failsoft.bench.llm import _Outcome
    from failsoft.bench.llm_impact import impact_ttft

    kill = 100.0
    before = _Outcome(sent=98.0, times=[98.2, 99.0])  # done before the kill: not in the window
    interrupted = _Outcome(sent=99.0, recoveries=1, times=[99.1, 99.5, 100.6])  # replay 600 ms
    after = _Outcome(sent=101.0, times=[101.3, 101.5])  # TTFT 300 ms
    broken = _Outcome(sent=99.0, recoveries=1, times=[99.2, 101.0], error="stream broke")
    got = impact_ttft([before, interrupted, after, broken], kill)
    assert got == {
        "impact_ttft_ms": 450.0,
        "impact_requests": 2,
        "sent_after_kill_ttft_ms": 300.0,
        "replay_ttft_ms": 600.0,
        "interrupted": 1,
    }


def test_cluster_recovery_ends_at_the_last_degraded_answer_against_the_no_failure_run() -> None:
    from failsoft.bench.llm import _Outcome
    from failsoft.bench.llm_impact import cluster_recovery

    kill = 100.0
    ref = [_Outcome(sent=s, times=[s + 0.2]) for s in (99.0, 101.0, 102.0, 104.0)]  # TTFT 200 ms each
    run = [
        _Outcome(sent=99.0, recoveries=1, times=[99.2, 100.5]),  # interrupted: replay at +500 ms
        _Outcome(sent=101.0, times=[102.5]),  # 1500 ms: degraded, first token at +2500 ms
        _Outcome(sent=102.0, times=[102.29]),  # 290 ms: within 10% + 100 ms of 200 ms
        _Outcome(sent=104.0, times=[104.2]),  # back to the baseline
    ]
    assert cluster_recovery(run, ref, kill) == {
        "cluster_recovery_ms": 2500.0,
        "cluster_recovery_bound_by": "ttft",
        "degraded_requests": 1,
    }
    healthy = [run[0], *ref[1:]]  # only the replay: it bounds the recovery
    assert cluster_recovery(healthy, ref, kill)["cluster_recovery_ms"] == 500.0
    assert cluster_recovery(healthy, ref, kill)["cluster_recovery_bound_by"] == "replay"
    assert cluster_recovery(ref, ref, kill)["cluster_recovery_ms"] == 0.0


def test_summary_compares_every_policy_with_stop_and_restart_over_rounds() -> None:
    from failsoft.bench.llm import summarize

    def row(ttft: float, rec: float) -> dict[str, float]:
        return {
            "impact_ttft_ms": ttft,
            "cluster_recovery_ms": rec,
            "restart_ms": 5000.0,
            "recomputed_tokens": 1,
        }

    rounds = [
        {"policies": {"lumen": row(100, 1000), "stop-and-restart": row(200, 3000)}},
        {"policies": {"lumen": row(300, 3000), "stop-and-restart": row(400, 5000)}},
    ]
    got = summarize(rounds, ("lumen", "stop-and-restart"))
    assert got["mean_over_rounds"]["lumen"]["impact_ttft_ms"] == 200.0
    assert got["vs_stop_and_restart_pct"]["lumen"]["impact_ttft_ms"] == round((200 / 300 - 1) * 100, 1)
    assert got["vs_stop_and_restart_pct"]["lumen"]["cluster_recovery_ms"] == -50.0
    assert got["vs_fixed_checkpointing_pct"] == {}  # not run
