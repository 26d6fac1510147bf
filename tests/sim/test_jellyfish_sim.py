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


def test_simulate_jellyfish_writes_csv_summary_and_figure(tmp_path, capsys, monkeypatch) -> None:
    import csv
    import functools
    import json

    from failsoft.cli import main
    from failsoft.sim import jellyfish

    small = functools.partial(
        jellyfish.Sweep, client_counts=(2,), fps=("15",), slos=("100",), traces=("wifi",)
    )
    monkeypatch.setattr(jellyfish, "Sweep", small)
    monkeypatch.setattr(jellyfish, "JellyfishSimConfig", lambda: JellyfishSimConfig(duration_s=2.0))
    out = tmp_path / "jf"
    argv = ["simulate", "jellyfish", "--seeds", "1", "--out", str(out), "-p", "jellyfish", "-p", "edf-small"]
    assert main(argv) == 0
    digest = json.loads(capsys.readouterr().out)
    assert {e["policy"] for e in digest["by_trace_policy"]} == {"jellyfish", "edf-small"}
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["policy"], r["trace"], r["clients"]) for r in rows] == [
        ("jellyfish", "wifi", "2"),
        ("edf-small", "wifi", "2"),
    ]
    assert (out / "jellyfish.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "jellyfish", "--out", str(out), "-p", "nope"]) != 0


LOW = Trace("low", (3.5,), 1.0)  # carries 160 px frames at 25 fps, not B0's 224 px (5.2 Mbit/s)
OLD = JellyfishSimConfig(duration_s=5.0, low_res_px=(), client_backoff=False)  # before the LTE fix


@pytest.mark.parametrize("policy", ["jellyfish", "edf-small"])
def test_an_uplink_too_slow_for_the_smallest_model_gets_served_at_a_lower_resolution(policy) -> None:
    from failsoft.adaptation_data import LOW_RES_PX, upscaled_accuracy

    client = ((150.0, 25.0),)
    new = simulate_run(efficientnet_ladder(low_res_px=LOW_RES_PX), client, LOW, policy, 0, CFG)
    assert new["miss_rate"] <= 0.01
    # its frames are upscaled 160 px ones, scored at the declared cost, below B0's own 77.7%
    b0 = efficientnet_ladder().rungs[0].accuracy
    assert new["accuracy"] == pytest.approx(upscaled_accuracy(b0, 160), abs=0.01)
    assert new["accuracy"] < b0 - 0.03
    old = simulate_run(efficientnet_ladder(), client, LOW, policy, 0, OLD)
    assert old["miss_rate"] >= 0.5  # no variant fitted: unmapped (jellyfish) or piled up on the uplink
    if policy == "jellyfish":
        assert old["dropped_unmapped"] >= 0.5 * old["requests"]
        assert new["dropped_unmapped"] == 0


def test_the_client_backs_off_on_its_own_estimate_in_a_dip() -> None:
    dip = Trace("dip", (10.0, 10.0, 10.0, 3.5, 3.5, 10.0), 1.0)  # two 2 s dips in any 12 s
    ladder = efficientnet_ladder(low_res_px=(128, 160, 192))
    clients = ((150.0, 25.0), (100.0, 15.0))
    cfg = JellyfishSimConfig(duration_s=12.0)
    slow = JellyfishSimConfig(duration_s=12.0, client_backoff=False)  # waits for the server's answers
    for seed in (0, 1):
        backoff = simulate_run(ladder, clients, dip, "jellyfish", seed, cfg)
        waits = simulate_run(ladder, clients, dip, "jellyfish", seed, slow)
        assert backoff["miss_rate"] < 0.5 * waits["miss_rate"]
        assert backoff["dropped_unmapped"] < 0.5 * waits["dropped_unmapped"]
