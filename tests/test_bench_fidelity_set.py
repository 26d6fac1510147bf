"""The fidelity set: every config is there, and a figure is reported only beside a quiet host."""

import re
from pathlib import Path

import pytest

from failsoft.bench import fidelity as fidelity_bench
from failsoft.bench import fidelity_set, fidelity_switch
from failsoft.bench.fidelity_set import FIDELITY_SET, QUIET_LOAD_PER_CORE, run_set, summarize
from failsoft.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _out(mttr=20.0, other_groups=None, contended=()):
    run = {"host_cpu": {"other_groups": other_groups}} if other_groups is not None else {"host_cpu": {}}
    return {
        "failed": ["a1"],
        "median_abs_error_pct": {"mttr": mttr, "first_answer": 30.0},
        "median_mttr_error_pct_by_kind": {"warm": 5.0, "progressive": mttr},
        "contended_profiles": list(contended),
        "runtime_runs": [run, run],
    }


def test_the_set_holds_the_fitted_the_untuned_and_the_mechanism_configs():
    for config, kill in FIDELITY_SET:
        assert (ROOT / config).is_file(), config
        assert kill
    names = {Path(c).stem for c, _ in FIDELITY_SET}
    assert {
        "bench",
        "fidelity",
        "fidelity-dense",
        "fidelity-small",
        "fidelity-pair",
        "fidelity-one",
        "fidelity-spread",
        "fidelity-site",
        "fidelity-busy",
        "fidelity-queue",
        "fidelity-mixed",
        "fidelity-beside",
        "fidelity-fan",
        "fidelity-converge",
        "fidelity-halves",
        "fidelity-tiers",
        "fidelity-serial",
        "fidelity-wide",
        "graph-echo-chain",
        "slo",
    } <= names


def test_a_quiet_run_is_a_figure_and_a_busy_one_is_flagged_not_reported():
    quiet = summarize("examples/bench.yaml", _out(), 0.1, 0.9)
    assert quiet["quiet"] and quiet["figure"] == 20.0 and quiet["flagged"] == []
    assert quiet["loadavg"] == {"per_core_before": 0.1, "per_core_after": 0.9}
    busy = summarize("examples/bench.yaml", _out(), QUIET_LOAD_PER_CORE + 1, 0.9)
    assert busy["figure"] is None and busy["median_mttr_error_pct"] == 20.0
    assert "per core before the runs" in busy["flagged"][0]
    others = summarize("examples/bench.yaml", _out(other_groups={"user-2": 0.5, "user-3": 0.3}), 0.1, 0.1)
    assert others["other_busy_cores"] == pytest.approx(0.8) and others["figure"] is None
    assert quiet["other_busy_cores"] is None  # not measured: said so, not read as none
    stale = summarize("examples/bench.yaml", _out(contended=["resnet/resnet18"]), 0.1, 0.1)
    assert stale["figure"] is None and "busy host" in stale["flagged"][0]


def test_the_set_runs_each_chosen_config_and_medians_the_quiet_figures(monkeypatch):
    # the host's load is set here (a real one cannot be ordered up); the cluster runs are stood in
    # for by their outputs (tests/runtime/test_bench_fidelity_live.py runs real ones)
    loads = iter([0.1, 0.1, 2.0, 2.0])
    monkeypatch.setattr(fidelity_set, "load_per_core", lambda cores: next(loads))
    calls = []

    def fidelity(path, **kw):
        calls.append((Path(path).name, kw["kill"]))
        return _out(mttr=10.0 * len(calls))

    out = run_set(ROOT, only=["graph", "slo"], repeats=1, sim_seeds=1, settle_s=0, fidelity=fidelity)
    assert calls == [("graph-echo-chain.yaml", ("s1",)), ("slo.yaml", ("e1",))]
    assert out["configs"]["graph-echo-chain"]["figure"] == 10.0
    assert out["configs"]["slo"]["figure"] is None  # busy: flagged
    assert out["median_mttr_error_pct"] == {"quiet": 10.0, "all": 15.0}


def test_a_replay_simulates_the_recorded_runs_again_beside_the_load_they_ran_under():
    recorded = run_set(ROOT, only=["small"], settle_s=0, fidelity=lambda path, **kw: _out(mttr=10.0))
    recorded["configs"]["fidelity-small"]["loadavg"] = {"per_core_before": 2.0, "per_core_after": 2.5}
    calls = []

    def fidelity(path, **kw):  # a replay passes the recorded runs and starts no cluster
        calls.append((Path(path).name, kw["kill"], kw["runs"]))
        return _out(mttr=30.0)

    out = run_set(ROOT, sim_seeds=2, fidelity=fidelity, replay=recorded)
    assert calls == [
        ("fidelity-small.yaml", ("s1",), recorded["configs"]["fidelity-small"]["detail"]["runtime_runs"])
    ]
    assert list(out["configs"]) == ["fidelity-small"]  # only what was recorded
    small = out["configs"]["fidelity-small"]
    assert small["median_mttr_error_pct"] == 30.0 and small["figure"] is None  # still busy when recorded
    assert small["loadavg"] == {"per_core_before": 2.0, "per_core_after": 2.5}
    with pytest.raises(ConfigError, match="not an output of 'failsoft bench fidelity-set'"):
        run_set(ROOT, replay={"per_app": {}})
    with pytest.raises(ConfigError, match="no runtime runs of the chosen configs"):
        run_set(ROOT, only=["slo"], replay=recorded)


def test_the_set_is_simulated_again_with_the_constant_of_its_own_quiet_fit_runs(monkeypatch):
    # the calibration itself runs on recorded probes in test_bench_fidelity_switch_replay.py; it is
    # stood in for here because examples/bench.yaml's zoo (ImageNet families) is not built in tests
    loads = iter([0.1, 0.1, 2.0, 2.0])  # bench.yaml ran quiet, fidelity-small on a busy host
    monkeypatch.setattr(fidelity_set, "load_per_core", lambda cores: next(loads))
    calls = []

    def fidelity(path, **kw):
        calls.append((Path(path).stem, kw.get("host_control_ms"), "runs" in kw))
        return _out(mttr=40.0 if kw.get("host_control_ms") is None else 20.0)

    given = []

    def calibrate(outputs, config_of, host, control):
        given.append(({name: c["quiet"] for name, c in outputs[0]["configs"].items()}, host, control))
        return {"ms": 33.5, "runs": 2, "per_run_ms": [30.0, 37.0], "configs": ["examples/bench.yaml"]}

    monkeypatch.setattr(fidelity_bench, "calibrate_control", calibrate)
    out = run_set(ROOT, only=["bench", "small"], settle_s=0, fidelity=fidelity, host="pin")
    # live runs first, then each config's recorded runs again with the host's constant, no cluster
    assert calls == [
        ("bench", None, False),
        ("fidelity-small", None, False),
        ("bench", 33.5, True),
        ("fidelity-small", 33.5, True),
    ]
    assert given == [({"bench": True, "fidelity-small": False}, "pin", fidelity_bench.DEFAULT_CONTROL_MODEL)]
    constant = out["host_control"]
    assert constant["calibration"]["ms"] == 33.5
    assert constant["configs"]["bench"]["figure"] == 20.0 and out["configs"]["bench"]["figure"] == 40.0
    assert constant["configs"]["fidelity-small"]["figure"] is None  # still the busy host's runs
    assert constant["median_mttr_error_pct"] == {"quiet": 20.0, "all": 20.0}
    calls.clear()
    monkeypatch.setattr(fidelity_set, "load_per_core", lambda cores: 0.1)
    given_ms = run_set(ROOT, only=["bench"], settle_s=0, fidelity=fidelity, host_control_ms=12.0)
    # the constant given: the one model, no second simulation
    assert "host_control" not in given_ms and calls == [("bench", 12.0, False)]


def test_a_set_without_quiet_fit_runs_says_why_it_has_no_host_constant():
    out = run_set(ROOT, only=["small"], settle_s=0, fidelity=lambda path, **kw: _out(mttr=10.0))
    assert out["host_control"]["calibration"] is None
    assert "bench.yaml, fidelity.yaml" in out["host_control"]["reason"]


def test_an_unknown_name_or_a_missing_checkout_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no config of the fidelity set matches"):
        run_set(ROOT, only=["nope"])
    with pytest.raises(ConfigError, match="fidelity set configs not found under"):
        run_set(tmp_path, only=["slo"])


def test_a_switch_error_is_relative_to_the_runtime_and_the_median_is_over_switches():
    a = fidelity_switch.compared({"app": "w", "variant": "v", "server": "e1", "runtime_ms": 100.0}, 80.0)
    b = fidelity_switch.compared({"app": "w", "variant": "u", "server": "e1", "runtime_ms": 50.0}, 65.0)
    c = fidelity_switch.compared({"app": "w", "variant": "x", "server": "e1", "runtime_ms": None}, 65.0)
    assert (a["error_pct"], b["error_pct"], c["error_pct"]) == (20.0, 30.0, None)
    assert fidelity_switch.summarize([[a], [b, c]])["median_abs_error_pct"] == 25.0


def test_control_from_names_a_file_it_cannot_read_and_outputs_without_the_calibration_configs(tmp_path):
    import json

    from typer.testing import CliRunner

    from failsoft.cli import app

    replay = ROOT / "docs" / "results" / "fidelity-set-round11-slo.json"
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not json")
    res = CliRunner().invoke(
        app, ["bench", "fidelity-set", "--replay", str(replay), "--control-from", str(garbage)]
    )
    flat = re.sub(r"[\s│╭╮╰╯─]", "", res.output)  # the usage error's box wraps at the terminal's width
    assert res.exit_code == 2 and "--control-from" in flat and "notes.txt" in flat
    other = tmp_path / "slo-only.json"  # a set without bench.yaml or fidelity.yaml runs
    other.write_text(replay.read_text())
    res = CliRunner().invoke(
        app, ["bench", "fidelity-set", "--replay", str(replay), "--control-from", str(other)]
    )
    # the command's ConfigError, which failsoft's entry point prints as "error: ..."
    assert isinstance(res.exception, ConfigError) and "bench.yaml, fidelity.yaml" in str(res.exception)
    assert json.loads(other.read_text())["configs"]  # nothing it was given is touched
