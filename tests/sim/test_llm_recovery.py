"""The LLM recovery simulator: every request completes after a failure under every policy, the
checkpoint accounting does not leak, and the command writes its outputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from failsoft.cli import app, main
from failsoft.policies import registry
from failsoft.services import LlmParams
from failsoft.sim.llm import ALL_POLICIES, LlmCluster, LlmSimConfig, get_llm_experiment
from failsoft.sim.llm.data import load_trace, step_times
from failsoft.sim.llm.metrics import measure

SMALL = LlmSimConfig(
    workers=4, failed=1, warmup_s=15.0, arrivals_after_s=25.0, window_s=20.0, target_load_s=8.0
)


def run(
    policy: str, config: LlmSimConfig = SMALL, params: LlmParams | None = None, seed: int = 1
) -> LlmCluster:
    return LlmCluster(config, registry.make("llm_recovery", policy, params), seed).run()


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_request_completes_after_a_failure(policy):
    cluster = run(policy)
    m = measure(cluster)
    assert m["interrupted"] > 0
    assert m["failed_requests"] == 0
    assert all(r.finish is not None and r.generated == r.output for r in cluster.requests)
    assert cluster.ledger.total_mb() == 0.0 and len(cluster.ledger) == 0  # no leaked checkpoint
    if policy == "stop-and-restart":
        assert m["restored_requests"] == 0 and m["recomputed_tokens"] > 0
    elif policy != "lumen-no-load-aware":
        assert m["restored_requests"] > 0


def test_restoring_recomputes_far_fewer_tokens_than_restarting():
    lumen, restart = measure(run("lumen")), measure(run("stop-and-restart"))
    assert lumen["recomputed_tokens"] < 0.2 * restart["recomputed_tokens"]


def test_a_zero_budget_checkpoints_nothing_and_still_recovers():
    cluster = run("lumen", params=LlmParams(checkpoint_budget_mb=0.0))
    m = measure(cluster)
    assert m["restored_requests"] == 0 and m["failed_requests"] == 0


def test_several_workers_fail_at_once():
    cluster = run("lumen", dataclasses.replace(SMALL, workers=8, failed=2))
    assert len(cluster.victims) == 2 and measure(cluster)["failed_requests"] == 0


def test_progressive_recovery_loads_the_draft_first():
    lumen, fixed = measure(run("lumen")), measure(run("fixed-checkpointing"))
    assert lumen["reload_ms"] == pytest.approx(
        (SMALL.detect_s + SMALL.draft_load_s + SMALL.target_load_s) * 1000
    )
    assert fixed["reload_ms"] == pytest.approx((SMALL.detect_s + SMALL.target_load_s) * 1000)


def test_the_shipped_data_is_small_and_complete():
    root = Path(__file__).parents[2] / "src/failsoft/data/llm"
    assert sum(p.stat().st_size for p in root.iterdir()) < 1_000_000
    assert (root / "PROVENANCE.md").exists()
    steps = step_times()
    assert steps.decode_ms(64) > steps.decode_ms(1) > 0 and steps.prefill_ms(4096) > steps.prefill_ms(512)
    for workload in ("conv", "code", "sharegpt"):
        arrivals, prompt, output = load_trace(workload)
        assert len(arrivals) > 1000 and (prompt > 0).all() and (output > 0).all()


def test_the_command_writes_csv_summary_and_figure(tmp_path):
    out = tmp_path / "llm"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "llm-recovery",
            "--quick",
            "--policy",
            "lumen",
            "--policy",
            "stop-and-restart",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert {e["policy"] for e in summary["by_policy"]} == {"no-failure", "lumen", "stop-and-restart"}
    assert (out / "results.csv").read_text().count("\n") == 1 + 2 * 3  # 2 scales x (baseline + 2)
    assert (out / "llm-recovery.png").stat().st_size > 0
    assert "vs_review_4_workers" in summary


def test_an_unknown_policy_is_refused(capsys):
    assert main(["simulate", "llm-recovery", "--quick", "--policy", "nope"]) == 2
    assert "unknown llm recovery policy 'nope'" in capsys.readouterr().err


def test_each_workload_runs_at_the_same_relative_load():
    exp = get_llm_experiment("llm-recovery-workloads", quick=True)
    rates = {p.label: p.config.rate_per_worker for p in exp.points}
    assert set(rates) == {"conv", "code", "sharegpt"}
    # ShareGPT's long outputs cost more per request than conversations, code's short ones less
    assert rates["sharegpt"] < rates["conv"] < rates["code"]
    assert rates["conv"] == LlmSimConfig().rate_per_worker
