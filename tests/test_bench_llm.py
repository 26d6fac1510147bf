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
        "reference_scale": 1.0,  # the request answered before the kill: 200 ms in both runs
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


def test_cluster_recovery_compares_with_the_reference_at_this_runs_pre_failure_level() -> None:
    """A no-failure run measured at three times the load (TTFT 600 ms) must not hide a run's
    degraded answers: its TTFTs are scaled by this run's pre-failure level (200 ms before the kill)."""
    from failsoft.bench.llm import _Outcome
    from failsoft.bench.llm_impact import cluster_recovery, reference_scale

    kill = 100.0
    slow_ref = [_Outcome(sent=s, times=[s + 0.6]) for s in (98.0, 99.0, 101.0, 104.0)]
    run = [
        _Outcome(sent=98.0, times=[98.2]),  # before the kill, 200 ms: a third of the reference's
        _Outcome(sent=99.0, recoveries=1, times=[99.2, 100.3]),  # replay at +300 ms
        _Outcome(sent=101.0, times=[101.5]),  # 500 ms: degraded at this run's level (200 ms)
        _Outcome(sent=104.0, times=[104.2]),  # back to it
    ]
    assert reference_scale(run, slow_ref, kill) == pytest.approx(1 / 3)
    got = cluster_recovery(run, slow_ref, kill)
    assert got["cluster_recovery_ms"] == 1500.0 and got["cluster_recovery_bound_by"] == "ttft"
    assert got["degraded_requests"] == 1
    # unscaled, the slow reference hid it: only the replay would have counted
    assert reference_scale(run[2:], slow_ref[2:], kill) == 1.0  # nothing before the kill: no scale


def test_results_are_saved_after_every_completed_run_so_a_crash_loses_nothing_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster runs are stood in for (a real one is a Ray session per run: docs/lumen.md runs
    them); what is tested is what ``run`` keeps when the third run crashes."""
    from pathlib import Path

    import failsoft.bench.llm as bench
    from failsoft.runtime.llm_config import LlmServing

    def one_run(config, serving, policy, settings, reqs):  # type: ignore[no-untyped-def]
        if policy == "stop-and-restart":
            raise RuntimeError("the machine went away")
        outcomes = [bench._Outcome(text="x", sent=a, times=[a + 0.1], ttft_ms=100.0) for a, _, _ in reqs]
        extra = {"restart_ms": None if policy is None else 900.0, "killed_at": None, "restarted_at": None}
        return outcomes, extra

    monkeypatch.setattr(bench, "_run_one", one_run)
    monkeypatch.setattr(bench, "_context", lambda serving: 256)
    monkeypatch.setattr(LlmServing, "build", lambda self: None)
    saved: list[dict] = []  # type: ignore[type-arg]
    settings = bench.LlmBenchSettings(("lumen", "stop-and-restart"), requests=4, rate_rps=2.0)
    config = Path(__file__).parents[1] / "examples" / "llm.yaml"
    with pytest.raises(RuntimeError, match="went away"):
        bench.run(config, settings, progress=lambda _: None, save=lambda r: saved.append(json_copy(r)))
    assert len(saved) == 2  # the reference, then lumen: each written as it completed
    assert saved[-1]["complete"] is False
    assert list(saved[-1]["rounds"][0]["policies"]) == ["lumen"]
    assert saved[-1]["rounds"][0]["no-failure"]["failed_requests"] == 0
    assert saved[-1]["summary"]["mean_over_rounds"]["lumen"]["restart_ms"] == 900.0


def json_copy(value: dict) -> dict:  # type: ignore[type-arg]
    import json

    return json.loads(json.dumps(value))
