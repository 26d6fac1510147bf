"""``bench llm``'s trace: the conversation trace rescaled to a model's context (no cluster here;
the bench itself runs in docs/lumen.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("numpy")


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
