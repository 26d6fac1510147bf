"""``failsoft simulate model-loss``: one model lost on a live server of a scenario JSON, twinned."""

from __future__ import annotations

import json

import pytest

from failsoft.cli import main
from failsoft.scenario import load_scenario
from failsoft.sim import SimConfig

SCENARIO = "examples/scenario.json"


def run(capsys, *args: str) -> dict:
    assert main(["simulate", "model-loss", "--scenario", SCENARIO, "--requests", "off", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_critical_app_switches_to_its_warm_backup_and_another_reloads_in_place(capsys):
    """faillite deploys warm backups for the critical cameras only: cam-1 switches to its backup
    (its client told in ``notify_ms``), ocr-1 reloads in place after its profiled load."""
    warm = run(capsys, "--server", "a1", "--app", "cam-1")
    assert (warm["recovery"], warm["lost_on"], warm["policy"]) == ("warm", "a1", "faillite")
    assert warm["server"] != "a1" and warm["mttr_ms"] == pytest.approx(SimConfig().notify_ms)
    reload = run(capsys, "--server", "a1", "--app", "ocr-1")
    scenario = load_scenario(SCENARIO)
    load_ms = scenario.primary_variant(scenario.app("ocr-1")).load_ms
    assert (reload["recovery"], reload["server"], reload["variant"]) == ("reload", "a1", "mlp_l")
    assert reload["mttr_ms"] == pytest.approx(load_ms + SimConfig().notify_ms, abs=1e-3)


def test_what_is_missing_is_named(capsys):
    assert main(["simulate", "model-loss", "--scenario", SCENARIO, "--app", "cam-1"]) != 0
    assert "simulate model-loss needs --server" in capsys.readouterr().err
