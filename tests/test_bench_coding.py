"""``failsoft bench coding``'s pure parts: the baseline apps it adds, its summaries and target checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from failsoft.bench.coding import CodingBenchSettings, Shot, _bench_config, _summary, _targets, _targets_met
from failsoft.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "coded.yaml"


def test_equal_resources_gets_one_instance_of_the_deployed_variant_per_coded_member():
    data, plan = _bench_config(EXAMPLE, CodingBenchSettings(root="/somewhere"))
    added = {a["name"]: a for a in data["apps"] if a["name"].startswith("er-")}
    assert sorted(added) == ["er-0", "er-1", "er-2"]  # k + r instances, like ParM's
    assert [added[a]["primary"] for a in sorted(added)] == [
        {"server": s, "variant": "mlp_m"} for s in ("s1", "s2", "s3")
    ]
    assert (plan.k, plan.r, plan.service, data["repository"]) == (2, 1, "digits", "/somewhere")
    assert _targets(plan, "parm") == ("digits",)
    assert _targets(plan, "none") == ("er-0", "er-1")  # no redundancy: k instances


def test_a_config_without_a_coded_service_is_refused(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text("name: x\nservers: []\napps: []\n")
    with pytest.raises(ConfigError, match="exactly one coded service; found 0"):
        _bench_config(path, CodingBenchSettings())
    with pytest.raises(ConfigError, match="unknown coding bench policy 'replication'"):
        CodingBenchSettings(policies=("replication",))
    with pytest.raises(ConfigError, match=r"rate_rps must be positive, got 0"):
        CodingBenchSettings(rate_rps=0)
    with pytest.raises(ConfigError, match=r"slow_ms must not be negative, got -1"):
        CodingBenchSettings(slow_ms=-1)


def test_summary_counts_failures_and_scores_reconstructed_answers_apart():
    shots = [Shot(0.0, 10.0 + i, True, reconstructed=i % 4 == 0, correct=i % 8 != 0) for i in range(100)]
    shots.append(Shot(0.0, 5000.0, False, error="NoRouteError: gone"))
    out = _summary(shots)
    assert (out["requests"], out["failed_requests"]) == (101, 1)
    assert out["latency_ms"]["p50"] == pytest.approx(59.5)  # failed requests have no latency
    assert out["reconstructed_fraction"] == 0.25
    assert out["degraded_accuracy"] == 0.48 and out["accuracy"] == 0.87  # 12 of 25; 87 of 100


def test_targets_compare_parm_with_equal_resources():
    def policy(p50: float, p999: float) -> dict:
        return {"latency_ms": {"p50": p50, "p99": p999, "p999": p999}}

    result = {
        "policies": {
            "parm": {**policy(10.5, 60.0), "encode_us": {"p50": 20.0}, "decode_us": {"p50": 12.0}},
            "equal-resources": policy(10.0, 100.0),
        },
        "failover": {"outage_ms": {"p50": 15.0, "max": 40.0}, "failed_requests": 0},
    }
    met = _targets_met(result)
    assert met["p999_below_er_pct"] == 40.0 and met["p999_at_least_35pct_below_er"]
    assert met["median_within_10pct_of_er"] and met["encode_le_50us"] and not met["decode_le_10us"]
    assert met["failover_outage_p50_le_20ms"] and met["failover_zero_failed"]


def test_a_model_of_another_input_shape_gets_seeded_random_images_and_no_accuracy():
    from dataclasses import replace

    from failsoft.bench.coding import _accuracy, _queries

    _, plan = _bench_config(EXAMPLE.parent / "coded-resnet18.yaml", CodingBenchSettings())
    images, labels = _queries(replace(plan, input_shape=(3, 224, 224)))
    again, _ = _queries(replace(plan, input_shape=(3, 224, 224)))
    assert images.shape == (64, 3, 224, 224) and labels is None and (images == again).all()
    digits, digit_labels = _queries(plan)  # the default shape: held-out digits with labels
    assert digits.shape[1:] == (64,) and digit_labels is not None and len(digit_labels) == len(digits)
    unlabelled = [Shot(0.0, 1.0, True, correct=None), Shot(0.0, 1.0, True, correct=None)]
    assert _accuracy(unlabelled) is None
    assert _accuracy([*unlabelled, Shot(0.0, 1.0, True, correct=True)]) == 1.0
