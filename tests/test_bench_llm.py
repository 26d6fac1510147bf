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
