"""``failsoft bench rollout``'s measurement on synthetic samples: gaps, failures, old answers."""

from __future__ import annotations

from failsoft.bench.rollout import measure
from failsoft.runtime.loadgen import Sample


def _samples(app: str, start: float, end: float, every: float, variant_at: float) -> list[Sample]:
    out, t = [], start
    while t < end:
        variant = "v@2" if t >= variant_at else "v"
        out.append(Sample(app, t, t + 0.004, True, "s1", variant))
        t = round(t + every, 6)
    return out


def test_a_clean_rollout_meets_every_target():
    samples = _samples("a", 0.0, 10.0, 0.05, 5.0)
    events = [{"type": "rollout", "app": "a", "timestamp": 5.0}]
    result = measure(["a"], samples, events, {"a": "v@2"}, 3.0, 7.0, 0.05)
    row = result["apps"]["a"]
    assert row["failed"] == 0 and row["old_after_switch"] == 0 and row["rolled_out"]
    assert abs(row["gap_ms"] - 50.0) < 1e-6 and abs(row["gap_excess_ms"]) < 1e-6
    assert all(result["targets"].values())


def test_a_pause_a_failure_and_old_answers_after_the_switch_are_counted():
    samples = [s for s in _samples("a", 0.0, 10.0, 0.05, 5.3) if not 4.0 <= s.sent < 4.5]
    samples.append(Sample("a", 6.0, 6.1, False, error="503"))
    events = [{"type": "rollout", "app": "a", "timestamp": 5.0}]
    result = measure(["a"], samples, events, {"a": "v@2"}, 3.0, 7.0, 0.05)
    row = result["apps"]["a"]
    assert row["failed"] == 1 and round(row["gap_ms"]) == 550
    assert row["old_after_switch"] == 5 and row["old_after_switch_strict"] == 6
    targets = result["targets"]
    assert not targets["failed==0"] and not targets["gap_excess<=p99+50ms"]
    assert not targets["new_version_after_switch"]
