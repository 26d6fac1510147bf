"""``failsoft bench adaptation``'s pure parts: the per-policy config, the summary, the target checks.
The bench itself runs clusters (minutes); its runtime pieces are tested in
tests/runtime/test_slo_service.py (SDK clients replaying traces) and the dispatcher's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from failsoft.bench.adaptation import (
    AdaptationBenchSettings,
    _bench_config,
    _policy_config,
    _summary,
    _targets_met,
)
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.slo_client import FrameResult

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "slo.yaml"


def test_each_policy_runs_the_service_with_its_policy_and_the_papers_queue_discipline():
    data, service = _bench_config(EXAMPLE, AdaptationBenchSettings(root="/zoo"))
    assert service == "digits" and data["repository"] == "/zoo" and data["gateway"]["port"] == 0
    for policy, discipline in (("jellyfish", "batch-lazy-drop"), ("edf-large", "edf")):
        cfg = _policy_config(data, service, policy)
        assert cfg["agents"]["queue"] == {"discipline": discipline, "max_batch": 8}
        (slo,) = config_from_dict(cfg, source="test").services
        assert slo.params.policy == policy
    assert data["agents"]["queue"]["discipline"] == "batch-lazy-drop"  # the original is untouched


def test_bad_settings_and_configs_are_refused_naming_the_value(tmp_path):
    with pytest.raises(ConfigError, match="unknown adaptation policy 'milp'"):
        AdaptationBenchSettings(policies=("milp",))
    with pytest.raises(ConfigError, match="unknown trace '5g'"):
        AdaptationBenchSettings(trace="5g")
    with pytest.raises(ConfigError, match="client_cfg_template_3_15_100"):
        AdaptationBenchSettings(clients=3)
    path = tmp_path / "plain.yaml"
    path.write_text("name: x\nservers: []\napps: []\n")
    with pytest.raises(ConfigError, match="exactly one slo service; found 0"):
        _bench_config(path, AdaptationBenchSettings())


def _frame(missed: bool, dropped: bool = False, error: str | None = None, **kw: object) -> FrameResult:
    fields = {"variant": "b", "accuracy": 0.9, "outputs": [0.0, 1.0], **kw}
    if dropped or error:
        fields = {"drop_reason": "deadline"} if dropped else {}
    return FrameResult(0.0, 120.0 if missed else 50.0, 10.0, 224, dropped, missed, error=error, **fields)  # type: ignore[arg-type]


def test_summary_counts_drops_lateness_and_failures_as_misses_and_scores_only_on_time_answers():
    frames = [
        (_frame(False), True),
        (_frame(False, accuracy=0.7, variant="a"), False),
        (_frame(True), True),  # late: answered, not in time
        (_frame(True, dropped=True), None),
        (_frame(True, error="NoRouteError: x"), None),
    ]
    s = _summary(frames)
    assert (s["requests"], s["miss_rate"], s["dropped"], s["late"], s["failed"]) == (5, 0.6, 1, 1, 1)
    assert s["accuracy"] == pytest.approx(0.8) and s["top1"] == 0.5  # the two on-time answers
    assert s["drop_reasons"] == {"deadline": 1} and s["variants"] == {"b": 1, "a": 1}
    assert s["latency_ms"]["p50"] == 50.0  # answered frames only (the late one too)


def test_targets_compare_jellyfish_with_the_trace_target_and_every_baseline():
    def result(jelly: float, **baselines: float) -> dict:
        policies = {"jellyfish": {"miss_rate": jelly, "accuracy": 0.95}}
        policies |= {p: {"miss_rate": m, "accuracy": 0.84} for p, m in baselines.items()}
        return {"policies": policies}

    met = _targets_met(result(0.012, **{"edf-small": 0.03}), "lte")
    assert met["miss_rate_met"] and met["below_every_baseline"] and met["accuracy_at_least_edf_small"]
    missed = _targets_met(result(0.012, **{"edf-small": 0.03, "edf-medium": 0.01}), "wifi")
    assert not missed["miss_rate_met"] and not missed["below_every_baseline"]
