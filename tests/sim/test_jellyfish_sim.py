"""``failsoft simulate jellyfish``: accounting and the behaviour that must hold on simple networks."""

from __future__ import annotations

import pytest

from failsoft.adaptation_data import Trace, efficientnet_ladder
from failsoft.sim.jellyfish import JellyfishSimConfig, simulate_run, summarize

CFG = JellyfishSimConfig(duration_s=5.0)
FAST = Trace("fast", (100.0,), 1.0)  # 100 Mbps, constant
CLIENTS = ((100.0, 15.0), (150.0, 25.0), (75.0, 15.0))


@pytest.fixture(scope="module")
def ladder():
    return efficientnet_ladder()


def test_every_frame_is_counted_once(ladder) -> None:
    result = simulate_run(ladder, CLIENTS, FAST, "jellyfish", 0, CFG)
    assert result["requests"] == pytest.approx(5.0 * (15 + 25 + 15), abs=3)
    assert result["answered_in_time"] + result["dropped"] + result["late"] <= result["requests"]


def test_on_a_fast_network_jellyfish_misses_nothing_and_beats_the_small_variant(ladder) -> None:
    jelly = simulate_run(ladder, CLIENTS, FAST, "jellyfish", 0, CFG)
    small = simulate_run(ladder, CLIENTS, FAST, "edf-small", 0, CFG)
    assert jelly["miss_rate"] <= 0.01
    assert small["miss_rate"] == 0.0
    assert jelly["accuracy"] > small["accuracy"]


def test_a_variant_too_slow_for_the_slo_is_dropped_lazily(ladder) -> None:
    # EfficientNet-B7 alone takes 84 ms: no frame of a 75 ms SLO can make it, each is dropped unrun
    result = simulate_run(ladder, ((75.0, 15.0),), FAST, "edf-large", 0, CFG)
    assert result["miss_rate"] == 1.0
    assert result["dropped"] >= result["requests"] - 2  # the last frames may still be in flight


def test_runs_are_reproducible_and_summarised_per_trace_and_policy(ladder) -> None:
    slow = Trace("slow", (8.0, 3.0), 1.0)
    first = simulate_run(ladder, CLIENTS, slow, "jellyfish", 3, CFG)
    assert first == simulate_run(ladder, CLIENTS, slow, "jellyfish", 3, CFG)
    rows = [{"trace": "slow", "policy": "jellyfish", **first}]
    (entry,) = summarize(rows, CFG)["by_trace_policy"]
    assert entry["miss_rate"] == pytest.approx(first["miss_rate"])
