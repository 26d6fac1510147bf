"""``failsoft simulate coding-tail``: ParM against Equal-Resources on the simulated cluster."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from failsoft.cli import app
from failsoft.sim.coding_tail import (
    CodingTailConfig,
    Costs,
    Point,
    measure_costs,
    points,
    service_model,
    simulate_point,
)

COSTS = Costs(encode_s=100e-6, decode_s=20e-6)  # the order the policy code measures; fixed here
CFG = CodingTailConfig(queries=6000)
GPU_270 = points("fig11")[2]  # the paper's default: GPU cluster, 270 qps, k = 2, 4 shuffles


def test_the_run_configurations_give_the_papers_points() -> None:
    assert [p.rate_qps for p in points("fig9a")] == [150, 180, 210, 240, 270, 300, 330, 360, 390]
    assert {p.cluster.data_instances for p in points("fig9b")} == {24}
    assert [p.k for p in points("fig10")] == [2, 3, 4]
    assert [p.shuffles for p in points("fig11")] == [2, 3, 4, 5]
    # the service time loads each cluster's m instances to top_load at its highest rate
    gpu, cpu = points("fig9a")[0].cluster, points("fig9b")[0].cluster
    assert service_model(gpu, CFG).batch_s(1) == pytest.approx(0.65 * 12 / 390)
    assert service_model(cpu, CFG).batch_s(1) == pytest.approx(0.65 * 24 / 240)


@pytest.mark.parametrize("rate", [150.0, 270.0])
def test_without_background_load_parms_median_is_equal_resources(rate: float) -> None:
    quiet = replace(GPU_270, shuffles=0, rate_qps=rate)
    parm, _ = simulate_point(quiet, "parm", 0, CFG, COSTS)
    er, _ = simulate_point(quiet, "equal-resources", 0, CFG, COSTS)
    assert parm["latency_p50_ms"] == pytest.approx(er["latency_p50_ms"], rel=0.03)
    assert parm["reconstructed_fraction"] < 0.01  # nothing straggles: the originals win


def test_with_background_load_parm_cuts_the_p999_on_every_seed() -> None:
    parm, er = [], []
    for seed in range(3):
        p, _ = simulate_point(GPU_270, "parm", seed, CFG, COSTS)
        e, _ = simulate_point(GPU_270, "equal-resources", seed, CFG, COSTS)
        assert p["latency_p999_ms"] <= e["latency_p999_ms"], seed
        assert p["reconstructed_fraction"] > 0.05  # the parity path answers the stragglers
        parm.append(p["latency_p999_ms"])
        er.append(e["latency_p999_ms"])
    assert np.median(parm) < np.median(er)


def test_every_query_is_answered_exactly_once_with_its_output_or_its_reconstruction() -> None:
    row, queries = simulate_point(GPU_270, "parm", 1, CFG, COSTS)
    assert len(queries) == CFG.queries
    assert all(q.answers == 1 and q.answered_s is not None for q in queries)
    rebuilt = [q for q in queries if q.reconstructed]
    assert rebuilt and row["discarded_answers"] > 0  # late originals came back and were dropped
    for q in queries:
        assert q.answer is not None
        np.testing.assert_allclose(q.answer, q.output, atol=1e-5)  # decoded == the lost output
        assert q.answered_s >= q.arrival_s + (COSTS.decode_s if q.reconstructed else 0.0)


def test_the_fill_timeout_bounds_the_wait_of_a_lone_query() -> None:
    # one query every ~2 s: every group is released uncoded after the fill timeout, nobody is held
    lone = replace(GPU_270, shuffles=0, rate_qps=0.5)
    cfg = CodingTailConfig(queries=300, warmup_queries=0, fill_timeout_ms=25.0)
    row, queries = simulate_point(lone, "parm", 0, cfg, COSTS)
    service_ms = row["service_ms"]
    assert row["complete_groups"] < 0.05 * cfg.queries
    assert row["partial_groups"] > 0.9 * cfg.queries
    assert row["max_group_wait_ms"] == pytest.approx(25.0)
    latencies = [1000.0 * ((q.answered_s or 0.0) - q.arrival_s) for q in queries]
    assert max(latencies) == pytest.approx(service_ms)  # answered by its own instance, never delayed


def test_busy_groups_never_wait_past_the_fill_timeout() -> None:
    row, _ = simulate_point(replace(GPU_270, k=4, rate_qps=150.0), "parm", 0, CFG, COSTS)
    assert 0 < row["max_group_wait_ms"] <= CFG.fill_timeout_ms + 1e-9
    assert row["partial_groups"] > 0 and row["complete_groups"] > 0


def test_equal_resources_has_the_parity_instances_as_extra_copies() -> None:
    point = Point("fig10", GPU_270.cluster, 3, 270.0, 4)
    rows = {
        p: simulate_point(point, p, 0, CodingTailConfig(queries=500), COSTS)[0]
        for p in ("parm", "equal-resources", "none")
    }
    assert rows["parm"]["instances"] == rows["equal-resources"]["instances"] == 16
    assert rows["none"]["instances"] == 12


def test_encode_and_decode_are_timed_with_the_policy_code() -> None:
    costs = measure_costs(2, reps=5)
    assert 0 < costs.decode_s < costs.encode_s < 0.05  # k images summed costs more than 1000 floats


def test_cli_quick_writes_csv_summary_and_figure(tmp_path) -> None:
    out = tmp_path / "ct"
    result = CliRunner().invoke(
        app, ["simulate", "coding-tail", "--quick", "--out", str(out), "-p", "parm", "-p", "equal-resources"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["figures"]) == {"fig9a", "fig9b", "fig10", "fig11"}
    point = summary["figures"]["fig11"]["points"][0]
    assert {"parm", "equal-resources", "p999_reduction_pct", "gap_ratio"} <= set(point)
    assert (out / "coding-tail.png").stat().st_size > 0
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert {"policy", "latency_p50_ms", "latency_p999_ms", "reconstructed_fraction"} <= set(header)


def test_the_rate_fill_timeout_codes_the_groups_a_fixed_10_ms_leaves_uncoded() -> None:
    # the CPU cluster's lowest rate (120 qps, 8.3 ms between queries) and k = 4 at 270 qps: the
    # runtime's rate policy (the same GroupFormer) codes about 99 % of groups, within its 100 ms cap
    for point in (points("fig9b")[0], replace(GPU_270, k=4)):
        rate, _ = simulate_point(point, "parm", 0, CFG, COSTS)
        fixed, _ = simulate_point(point, "parm", 0, replace(CFG, fill="fixed", fill_timeout_ms=10.0), COSTS)
        share = rate["partial_groups"] / (rate["partial_groups"] + rate["complete_groups"])
        before = fixed["partial_groups"] / (fixed["partial_groups"] + fixed["complete_groups"])
        assert share < 0.03 and before > 0.2, (point, share, before)
        assert rate["max_group_wait_ms"] <= CFG.fill_timeout_ms
        assert rate["reconstructed_fraction"] > fixed["reconstructed_fraction"]
