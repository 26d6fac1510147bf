"""``failsoft bench llm-engine``: the engine against ``transformers``' generate, on the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from failsoft.bench.llm_engine import EngineBenchSettings, run
from failsoft.cli import app
from failsoft.errors import ConfigError


def test_small_run_reports_both_ratios_and_equal_outputs():
    result = run(EngineBenchSettings(new_tokens=8, prompt_tokens=8, batch=4, repeats=1))
    assert result["identical"] is True
    assert set(result["tokens_per_s"]) == {"generate_b1", "engine_b1", "engine_b4", "generate_b4"}
    assert result["generate_over_engine_b1"] > 0 and result["engine_b4_over_b1"] > 0
    assert set(result["targets"]) == {"b1_within_1_3x", "b4_at_least_3x"}


def test_cli_prints_the_json(tmp_path):
    out = tmp_path / "engine.json"
    res = CliRunner().invoke(
        app, ["bench", "llm-engine", "--repeats", "1", "--new-tokens", "4", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["benchmark"] == "llm-engine"


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match="batch must be >= 1; got 0"):
        EngineBenchSettings(batch=0)
