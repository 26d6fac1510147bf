"""``failsoft bench coding``'s pure parts: the baseline apps it adds, its summaries and target checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from failsoft.bench.coding import (
    CodingBenchSettings,
    Shot,
    _bench_config,
    _counts_since,
    _level_line,
    _summary,
    _targets,
    _targets_met,
    sweep_levels,
)
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
    assert met["parm_over_er_p999"] == 0.6 and met["parm_over_er_p50"] == 1.05
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


def test_sweep_levels_pair_every_rate_with_every_straggler_level_and_name_bad_values():
    assert sweep_levels(["5", "20"], ["0", "200"]) == ((5.0, 0.0), (5.0, 200.0), (20.0, 0.0), (20.0, 200.0))
    assert sweep_levels([20.0], [50.0]) == ((20.0, 50.0),)
    for rates, slows, message in [
        (["20"], ["0", "0.0"], r"--slow-ms '0.0' is given twice"),
        (["20"], ["-5"], r"--slow-ms '-5' is out of range: it must be in 0..10000"),
        (["20"], ["abc"], r"--slow-ms 'abc' is not a number"),
        (["20"], ["nan"], r"--slow-ms 'nan' is out of range"),
        (["0.5"], ["50"], r"--rate-rps '0.5' is out of range: it must be in 1..1000"),
        ([], ["50"], r"--rate-rps needs at least one value"),
    ]:
        with pytest.raises(ConfigError, match=message):
            sweep_levels(rates, slows)


def test_settings_refuse_a_level_twice_and_bad_straggler_counts_by_value():
    settings = CodingBenchSettings(sweep=((20.0, 0.0), (20.0, 50.0)))
    assert settings.levels() == ((20.0, 0.0), (20.0, 50.0))
    assert CodingBenchSettings(rate_rps=7.0, slow_ms=3.0).levels() == ((7.0, 3.0),)
    with pytest.raises(ConfigError, match=r"rate_rps=20.0, slow_ms=0.0 is given twice"):
        CodingBenchSettings(sweep=((20.0, 0.0), (20.0, 0.0)))
    with pytest.raises(ConfigError, match=r"slow_ms must not be negative, got -1.0"):
        CodingBenchSettings(sweep=((20.0, -1.0),))
    with pytest.raises(ConfigError, match=r"stragglers must be 1..4 .* got 0"):
        CodingBenchSettings(stragglers=0)
    with pytest.raises(ConfigError, match=r"fill_timeout_ms must be in \(0, 10000\], got 0"):
        CodingBenchSettings(fill_timeout_ms=0)


def test_a_fill_timeout_given_to_the_bench_replaces_the_services():
    data, _ = _bench_config(EXAMPLE, CodingBenchSettings(fill_timeout_ms=300))
    (service,) = data["services"]
    assert service["params"] == {"k": 2, "r": 1, "encoder": "add", "fill_timeout_ms": 300}
    data, _ = _bench_config(EXAMPLE, CodingBenchSettings())
    assert "fill_timeout_ms" not in data["services"][0]["params"]


def _cli(monkeypatch, capsys, *args: str):
    """Run ``failsoft bench coding`` on the example; the settings its ``run`` would get, or None."""
    import failsoft.bench.coding as coding
    from failsoft.cli import main

    seen = []
    monkeypatch.setattr(coding, "run", lambda config, settings, progress=None: seen.append(settings) or {})
    code = main(["bench", "coding", str(EXAMPLE), *args])
    return code, (seen[0] if seen else None), capsys.readouterr().err


def test_the_cli_makes_a_sweep_of_repeated_values_and_one_level_of_one(monkeypatch, capsys):
    code, settings, _ = _cli(monkeypatch, capsys, "--slow-ms", "0", "--slow-ms", "20", "--slow-ms", "50")
    assert code == 0 and settings.levels() == ((20.0, 0.0), (20.0, 20.0), (20.0, 50.0))
    assert settings.sweep  # several levels: the output has one entry per level
    code, settings, _ = _cli(
        monkeypatch, capsys, "--rate-rps", "5", "--slow-ms", "200", "--stragglers", "2",
        "--fill-timeout-ms", "300", "--no-failover",
    )  # fmt: skip
    assert code == 0 and settings.sweep == () and settings.levels() == ((5.0, 200.0),)
    assert (settings.stragglers, settings.fill_timeout_ms, settings.failover) == (2, 300.0, False)
    code, settings, _ = _cli(monkeypatch, capsys)
    assert code == 0 and settings.levels() == ((20.0, 50.0),)  # the defaults


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--slow-ms", "50", "--slow-ms", "50"), "error: --slow-ms '50' is given twice"),
        (("--slow-ms", "-5"), "error: --slow-ms '-5' is out of range: it must be in 0..10000"),
        (("--slow-ms", "fast"), "error: --slow-ms 'fast' is not a number"),
        (("--rate-rps", "2000"), "error: --rate-rps '2000' is out of range: it must be in 1..1000"),
    ],
)
def test_the_cli_refuses_a_bad_sweep_value_naming_it(monkeypatch, capsys, args, message):
    code, settings, err = _cli(monkeypatch, capsys, *args)
    assert code == 2 and settings is None and message in err


def test_a_level_line_gives_each_policys_percentiles_and_the_p999_ratio():
    level = {
        "rate_rps": 20.0,
        "slow_ms": 50.0,
        "policies": {
            "parm": {"latency_ms": {"p50": 30.0, "p99": 80.0, "p999": 90.0}},
            "equal-resources": {"latency_ms": {"p50": 20.0, "p99": 100.0, "p999": 120.0}},
        },
        "targets": {"parm_over_er_p999": 0.75},
    }
    assert _level_line(level) == (
        "rate 20 rps, slow 50 ms: parm p50/p99/p99.9 30.0/80.0/90.0 ms; "
        "equal-resources p50/p99/p99.9 20.0/100.0/120.0 ms; parm/equal-resources p99.9 0.75"
    )
    before = {"requests": 10, "reconstructed": 3, "encode_us_p50": 30.0, "k": 2}
    now = {"requests": 25, "reconstructed": 7, "encode_us_p50": 31.0, "k": 2}
    assert _counts_since(before, now) == {"requests": 15, "reconstructed": 4, "encode_us_p50": 31.0, "k": 2}


@pytest.mark.slow  # the shuffler runs 0.6 s of the wall clock
def test_the_background_shuffle_slows_random_pairs_and_restores_every_server():
    import asyncio

    from failsoft.bench.coding import _shuffle

    class Admin:  # records the chaos calls the shuffle makes (the cluster's admin endpoint)
        def __init__(self) -> None:
            self.slow: dict[str, float] = {}
            self.pairs: list[tuple[str, ...]] = []

        async def admin(self, what: str, server: str, ms: float) -> None:
            assert what == "slow"
            self.slow[server] = ms
            slowed = tuple(sorted(s for s, v in self.slow.items() if v))
            if len(slowed) == 2 and (not self.pairs or self.pairs[-1] != slowed):
                self.pairs.append(slowed)

    _, plan = _bench_config(EXAMPLE, CodingBenchSettings())
    admin = Admin()

    async def shuffle() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(
            _shuffle(admin, plan, CodingBenchSettings(stragglers=2, shuffle_s=0.05, slow_ms=70), stop)
        )
        await asyncio.sleep(0.6)
        stop.set()
        await task

    asyncio.run(shuffle())
    assert len(admin.pairs) >= 2 and len(set(admin.pairs)) >= 2  # different pairs, two at a time
    assert all(set(p) <= {"s1", "s2", "s3"} for p in admin.pairs)
    assert admin.slow == {"s1": 0, "s2": 0, "s3": 0}  # every server restored at the end


def test_policy_timing_times_the_gateways_encode_and_decode_calls_warm_and_cold():
    from failsoft.bench.coding import policy_timing

    timing = policy_timing(repeats=200, cold_repeats=5)
    for figure in (timing["encode_us"], timing["decode_us"], timing["decoder_us"]):
        assert 0 < figure["p50"] < 10_000
    assert set(timing["paper_size"]) == {"encode_us", "decode_us", "decoder_us"}
    assert timing["cold_us"]["decode_p50"] > 0 and timing["cold_us"]["encode_p50"] > 0
    assert "median of 200 calls" in timing["how"] and "5 each" in timing["how"]
