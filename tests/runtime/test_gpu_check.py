"""``tools/gpu-check --dry-run``: the GPU checks rehearsed on the CPU, as a session with a device
will run them (docs/operations.md, "GPU checks").

The dry run starts real embedded Ray clusters whose node offers one GPU no device backs, so Ray's
grants are real and models load on the CPU. It runs within its own budget; here the budget is the
dry run's default (a minute), so the checks that do not fit are ``skipped`` for the budget, which
is what this test checks they may be, beside a first check that ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.runtime]
REPO = Path(__file__).resolve().parents[2]
CHECKS = ("environment", "placement", "memory", "faillite", "restart", "lumen", "parm", "tests")


def test_the_dry_run_reports_every_check_with_a_status(tiny_zoo, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    cmd = [sys.executable, str(REPO / "tools" / "gpu-check"), "--dry-run", "--prebuilt", str(tiny_zoo.root)]
    proc = subprocess.run(
        [*cmd, "--work", str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert json.loads((tmp_path / "out" / "gpu-check.json").read_text()) == result
    assert result["dry_run"] is True
    assert tuple(result["checks"]) == CHECKS
    assert result["wall_s"] <= result["budget_s"] + 15  # it stopped itself (a check's kill included)
    for name, check in result["checks"].items():
        assert check["status"] in ("ok", "skipped"), (name, check)
        if check["status"] == "skipped":  # only for the budget, never for an error
            assert check["reason"].startswith(("budget:", "time box")), (name, check)
    assert result["checks"]["environment"]["status"] == "ok"
    assert result["checks"]["environment"]["packages"]["ray"]


def test_an_unknown_check_is_one_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu-check"), "--dry-run", "--checks", "placement,gpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown check(s) gpu (known: environment, placement, memory" in proc.stderr
