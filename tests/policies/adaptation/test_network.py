"""Budget, bandwidth, frame size and lazy-drop arithmetic on explicit times; bad input named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from failsoft.adaptation_data import bundled_client_set, bundled_trace, read_trace
from failsoft.errors import ConfigError
from failsoft.policies.adaptation.model import Ladder
from failsoft.policies.adaptation.network import (
    BandwidthWindow,
    ErrorBasedFilter,
    OverheadTracker,
    UplinkEstimator,
    carried_frame_rung,
    frame_kbit,
    latency_budgets_ms,
    next_frame_rung,
    server_deadline_s,
)
from failsoft.policies.queueing import BatchLazyDrop, Queued, ServiceModel


def test_budget_is_slo_minus_transfer_rtt_and_overhead(ladder: Ladder) -> None:
    kbit = [r.frame_kbit for r in ladder.rungs]
    budgets = latency_budgets_ms(ladder, 100.0, 15.0, 10_000.0, 2.0, 4.0)
    assert budgets == pytest.approx([100.0 - k / 10_000.0 * 1000.0 - 2.0 - 4.0 for k in kbit])


def test_budget_is_zero_where_the_uplink_cannot_carry_the_frames(ladder: Ladder) -> None:
    kbit = [r.frame_kbit for r in ladder.rungs]
    bandwidth = 30.0 * (kbit[0] + kbit[1]) / 2  # 30 fps of the small frames fit, not of the larger
    budgets = latency_budgets_ms(ladder, 150.0, 30.0, bandwidth, 0.0, 0.0)
    assert budgets[0] > 0
    assert budgets[1:] == (0.0, 0.0)


def test_budget_never_goes_negative(ladder: Ladder) -> None:
    assert latency_budgets_ms(ladder, 20.0, 1.0, 500.0, 5.0, 4.0) == (0.0, 0.0, 0.0)


def test_frame_size_follows_the_public_compression_ratios() -> None:
    assert frame_kbit(128) == pytest.approx(128 * 128 * 3 / 1024 / 4.78 * 8)
    assert frame_kbit(608) == pytest.approx(608 * 608 * 3 / 1024 / 8.131 * 8)
    assert frame_kbit(224) < frame_kbit(600)


def test_lazy_drop_uses_the_server_deadline(ladder: Ladder) -> None:
    # SLO 100 ms, 200 kbit at 10 Mbps (20 ms) + 2 ms RTT + 4 ms overhead: 74 ms left on the server.
    deadline = server_deadline_s(10.0, 100.0, 200.0, 10_000.0, 2.0, 4.0)
    assert deadline == pytest.approx(10.074)
    service = ServiceModel(ladder.rungs[1].variant)  # 10 ms alone
    queue = [Queued("a", 10.0, deadline)]
    discipline = BatchLazyDrop(max_batch=4)
    assert discipline.next_batch(queue, 10.063, service).run == (queue[0],)  # 63 + 10 <= 74: runs
    late = discipline.next_batch(queue, 10.065, service)  # 65 + 10 > 74: cannot make it even alone
    assert late.drop == (queue[0],) and not late.run


def test_bandwidth_window_is_the_harmonic_mean_of_the_last_second() -> None:
    window = BandwidthWindow(initial_kbps=50_000.0)
    assert window.estimate(0.0) == 50_000.0
    for t, kbps in ((0.0, 1000.0), (0.5, 4000.0), (1.2, 4000.0)):
        window.report(t, kbps)
    assert window.estimate(1.2) == pytest.approx(4000.0)  # the report at 0.0 s is out of the window
    window.report(1.3, 1000.0)
    assert window.estimate(1.3) == pytest.approx(3 / (1 / 4000 + 1 / 4000 + 1 / 1000))
    assert window.estimate(5.0) == pytest.approx(1000.0)  # the newest report is always kept


def test_error_based_filter_tracks_a_step_and_tolerates_exact_observations() -> None:
    f = ErrorBasedFilter()
    for _ in range(3):
        assert f.update(20.0) == 20.0  # all errors 0: no division by zero, estimate kept
    estimates = [f.update(40.0) for _ in range(30)]
    assert all(20.0 <= e <= 40.0 for e in estimates)
    assert estimates[-1] == pytest.approx(40.0, abs=1.0)


def test_uplink_estimate_subtracts_server_time_and_resets_on_a_new_frame_size() -> None:
    est = UplinkEstimator(one_way_ms=0.5)
    kbps = est.observe(200.0, round_trip_ms=35.0, server_ms=15.0)  # 20 ms upload
    assert kbps == pytest.approx(200.0 / (20.0 - 0.45) * 1000.0)
    assert est.observe(400.0, 55.0, 15.0) == pytest.approx(400.0 / (40.0 - 0.45) * 1000.0)
    assert est.observe(400.0, 10.0, 15.0) is None  # residence longer than the round trip: skipped


def test_overhead_is_an_ewma_of_what_is_measured() -> None:
    tracker = OverheadTracker()
    assert tracker.total_ms == 4.0  # 2 x 1 + 0 + 2
    tracker.observe(3.0, 2.0, 0.0)
    assert (tracker.dispatch_ms, tracker.preprocess_ms, tracker.noise_ms) == (2.0, 1.0, 1.0)
    assert tracker.total_ms == 6.0


def test_frame_size_steps_down_with_the_bandwidth(ladder: Ladder) -> None:
    top = ladder.size - 1
    assert next_frame_rung(ladder, top, 1, 150.0, 15.0, 100_000.0, 1.0, 4.0) == top
    assert next_frame_rung(ladder, top, 1, 150.0, 15.0, 600.0, 1.0, 4.0) == 0
    # the large frame's transfer leaves less than 2 l(b) of the worker's variant: one step down
    kbit = [r.frame_kbit for r in ladder.rungs]
    compute = 2 * ladder.latency_ms[top, 0]
    bandwidth = (kbit[1] + kbit[2]) / 2 / (100.0 - compute) * 1000.0
    assert next_frame_rung(ladder, top, 1, 100.0, 1.0, bandwidth, 0.0, 0.0) == 1
    assert next_frame_rung(ladder, None, 0, 150.0, 15.0, 100_000.0, 1.0, 4.0) == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"slo_ms": 9.0}, "slo_ms 9.0"),
        ({"fps": 0.0}, "0.0"),
        ({"bandwidth_kbps": -5.0}, "-5.0"),
        ({"bandwidth_kbps": 1e12}, "1000000000000.0"),
        ({"bandwidth_kbps": math.nan}, "nan"),
    ],
)
def test_bad_client_input_is_refused_naming_the_value(ladder: Ladder, kwargs: dict, named: str) -> None:
    args = {"slo_ms": 100.0, "fps": 15.0, "bandwidth_kbps": 10_000.0, "rtt_ms": 1.0, "overhead_ms": 4.0}
    with pytest.raises(ConfigError, match=named):
        latency_budgets_ms(ladder, **{**args, **kwargs})


def test_a_bandwidth_report_that_is_absurd_is_refused() -> None:
    window = BandwidthWindow(10_000.0)
    with pytest.raises(ConfigError, match="-1"):
        window.report(0.0, -1.0)
    assert window.estimate(0.0) == 10_000.0


def test_bad_traces_are_refused_with_file_and_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match=r"empty\.txt.*empty"):
        read_trace(empty)
    words = tmp_path / "words.txt"
    words.write_text("12.5\n\nfast\n")
    with pytest.raises(ConfigError, match=r"words\.txt' line 3: 'fast' is not a number"):
        read_trace(words)
    negative = tmp_path / "neg.txt"
    negative.write_text("3\n-2\n")
    with pytest.raises(ConfigError, match=r"line 2: -2.0 Mbps"):
        read_trace(negative)


def test_the_shipped_traces_and_client_sets_read_back() -> None:
    synthetic = bundled_trace("synthetic")
    assert synthetic.mbps == (20.0, 15.0, 10.0, 7.5, 10.0, 15.0, 20.0)
    assert synthetic.at(45.0) == 10.0 and synthetic.at(140.0) == 20.0  # 20 s steps, looping
    assert len(bundled_trace("wifi").mbps) == 200 and len(bundled_trace("lte").mbps) == 199
    assert bundled_client_set(4, "var", "var") == ((75.0, 15.0), (100.0, 15.0), (150.0, 25.0), (75.0, 25.0))


def test_baseline_clients_send_the_largest_frame_their_uplink_carries(ladder: Ladder) -> None:
    kbit = [r.frame_kbit for r in ladder.rungs]
    top = ladder.size - 1
    assert carried_frame_rung(ladder, top, 10.0, 10.0 * kbit[top] * 1.01) == top
    assert carried_frame_rung(ladder, top, 10.0, 10.0 * kbit[1] * 1.01) == 1
    assert carried_frame_rung(ladder, 1, 10.0, 1e6) == 1  # never above the variant's own input
    assert carried_frame_rung(ladder, top, 10.0, 1.0) == 0
