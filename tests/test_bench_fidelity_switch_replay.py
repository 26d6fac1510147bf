"""The slo ladder switches' twin, replayed on a recorded run of examples/slo.yaml: it takes its
control cost from the calm probe made just before the switches, not from the crash's probe made
under load (which made the switches 72% wrong in round 10 of docs/results.md), in either form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from failsoft.bench import fidelity
from failsoft.bench.cluster import read_bench_config
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.sim import simulate_pin

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RECORDED = ROOT / "docs" / "results" / "fidelity-set-round11-slo.json"  # fresh runs of examples/slo.yaml
FIELD = {"wait": "control_ms", "work": "control_work_ms", "ahead": "control_work_ms"}
KEY = {"wait": "control_ms", "work": "control_work_ms", "ahead": "control_ahead_ms"}


def _recorded_run() -> dict:
    out = json.loads(RECORDED.read_text())
    run = out["configs"]["slo"]["detail"]["runtime_runs"][0]
    assert run["before_kill"]["events"] and run["before_kill"]["calm_probe"]["events"]
    return run


@pytest.fixture
def slo_config(tiny_zoo, tmp_path):
    data = read_bench_config(EXAMPLES / "slo.yaml", tiny_zoo.root) | {"state_dir": str(tmp_path / "state")}
    return config_from_dict(data, base_dir=EXAMPLES)


@pytest.mark.parametrize("control", ["wait", "work", "ahead"])
def test_the_switch_twin_takes_the_calm_probes_control_cost(slo_config, monkeypatch, control):
    run = _recorded_run()
    calm = fidelity.control_cost(slo_config, run, probes=run["before_kill"]["calm_probe"], control=control)
    crash = fidelity.control_cost(slo_config, run, control=control)
    assert set(calm) == set(crash) == {KEY[control]}
    calm_ms, crash_ms = calm[KEY[control]], crash[KEY[control]]
    assert calm_ms > 0 and abs(calm_ms - crash_ms) > 1.0

    used: list[float] = []  # each switch's twin's control cost (the probes' twins are simulate_pins)

    def spy(deployment, request, sim_config):
        assert sim_config.control_ahead is (control == "ahead")
        used.append(getattr(sim_config, FIELD[control]))
        return simulate_pin(deployment, request, sim_config)

    monkeypatch.setattr("failsoft.sim.simulate_pin", spy)
    switches = fidelity.simulate_switches(slo_config, run, control=control)
    assert len(switches) == len(used) == len(run["before_kill"]["events"])
    assert all(ms == pytest.approx(calm_ms) for ms in used)

    # a run recorded before the calm probe existed falls back to the crash's probe, as it was
    used.clear()
    before = {**run, "before_kill": {k: v for k, v in run["before_kill"].items() if k != "calm_probe"}}
    fidelity.simulate_switches(slo_config, before, control=control)
    assert used and all(ms == pytest.approx(crash_ms) for ms in used)


def test_a_costlier_calm_probe_makes_every_switch_twin_slower_by_its_cost(slo_config):
    run = _recorded_run()
    calm = run["before_kill"]["calm_probe"]
    cheap = fidelity.simulate_switches(slo_config, run, control="wait")
    dearer = {**calm, "events": [{**e, "runtime_ms": e["runtime_ms"] + 50.0} for e in calm["events"]]}
    slower = {**run, "before_kill": {**run["before_kill"], "calm_probe": dearer}}
    dear = fidelity.simulate_switches(slo_config, slower, control="wait")
    for a, b in zip(cheap, dear, strict=True):
        assert b["sim_ms"] == pytest.approx(a["sim_ms"] + 50.0, abs=1.0)


def test_on_the_host_its_probe_met_the_control_work_costs_about_what_the_wait_does(slo_config):
    # both are fitted on the calm probe, and a switch, one load alone, meets the host it met
    run = _recorded_run()
    as_wait = fidelity.simulate_switches(slo_config, run, control="wait")
    as_work = fidelity.simulate_switches(slo_config, run, control="work")
    for a, b in zip(as_wait, as_work, strict=True):
        assert b["sim_ms"] == pytest.approx(a["sim_ms"], rel=0.25)


def test_the_hosts_control_cost_is_the_median_of_the_calibration_runs_probe_fits(slo_config):
    # the recorded slo runs stand in for bench.yaml's and fidelity.yaml's (the tiny zoo has only
    # their digits model); each run's crash probe fits its own cost, the host's is their median
    out = json.loads(RECORDED.read_text())
    runs = out["configs"]["slo"]["detail"]["runtime_runs"]
    own = [fidelity.control_cost(slo_config, r)["control_ahead_ms"] for r in runs]
    loaded: list[str] = []

    def config_of(path: str):
        loaded.append(path)
        return slo_config

    calibration = fidelity.calibrate_control([out], config_of, configs=("slo",))
    assert calibration["per_run_ms"] == pytest.approx(own, abs=0.01)
    assert calibration["ms"] == pytest.approx(sorted(own)[len(own) // 2], abs=0.01)
    assert calibration["runs"] == len(runs) and calibration["configs"] == ["examples/slo.yaml"]
    assert loaded == ["examples/slo.yaml"]  # once per config, not per run
    with pytest.raises(ConfigError, match=r"bench\.yaml, fidelity\.yaml"):  # only the fit configs count
        fidelity.calibrate_control([out], config_of)
    busy = {**out, "configs": {"slo": {**out["configs"]["slo"], "quiet": False}}}
    with pytest.raises(ConfigError, match="no run with a control probe"):  # a busy host's probes: left out
        fidelity.calibrate_control([busy], config_of, configs=("slo",))
    with pytest.raises(ConfigError, match="not an output"):
        fidelity.calibrate_control([{"median_mttr_error_pct": 3.0}], config_of)


def test_the_hosts_control_cost_replaces_each_runs_own_in_the_twin(slo_config, monkeypatch):
    run = _recorded_run()
    given: list[float] = []  # the control work each simulated crash was given
    from failsoft import sim

    original = sim.simulate_failure

    def spy(deployment, failed, config, seed=0):
        given.append(config.control_work_ms)
        return original(deployment, failed, config, seed=seed)

    monkeypatch.setattr(sim, "simulate_failure", spy)
    fidelity.simulate_run(slo_config, run, ["e1"], 1, host_control_ms=17.5)
    own = fidelity.control_cost(slo_config, run)["control_ahead_ms"]
    fidelity.simulate_run(slo_config, run, ["e1"], 1)
    assert given == [pytest.approx(17.5), pytest.approx(own)]
