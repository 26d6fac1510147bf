"""The slo ladder switches' twin, replayed on a recorded run of examples/slo.yaml: it takes its
control cost from the calm probe made just before the switches, not from the crash's probe made
under load (which made the switches 72% wrong in round 10 of docs/results.md), in either form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from failsoft.bench import fidelity
from failsoft.bench.cluster import read_bench_config
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
