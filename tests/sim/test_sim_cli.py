"""``failsoft simulate``: the files it writes and the errors it refuses with."""

from __future__ import annotations

import csv
import json

from failsoft.cli import main


def test_simulate_writes_csv_summary_and_figure(tmp_path, capsys):
    out = tmp_path / "tb"
    code = main(
        ["simulate", "testbed", "--seeds", "2", "--out", str(out), "-p", "faillite", "-p", "full-warm"]
    )
    assert code == 0
    digest = json.loads(capsys.readouterr().out)
    assert set(digest["by_policy"]) == {"faillite", "full-warm"}
    with (out / "results.csv").open() as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames[:7] == ["experiment", "policy", "axis", "x", "label", "seed", "recovery_rate"]
    assert {"mttr_ms", "accuracy_reduction_pct"} <= set(reader.fieldnames)
    assert len(rows) == 2 * 6 * 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["figure"] == "Fig. 7"
    spread = summary["by_policy"][0]["recovery_rate"]
    assert set(spread) == {"mean", "std", "min", "max", "n"}
    assert (out / "testbed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_experiment_lists_the_known_ones(capsys):
    assert main(["simulate", "fig99"]) == 2
    err = capsys.readouterr().err
    assert "unknown experiment 'fig99'" in err and "site-failure" in err and "scalability" in err


def test_unknown_policy_and_bad_requests_mode_are_refused(tmp_path, capsys):
    assert main(["simulate", "testbed", "--out", str(tmp_path), "-p", "oracle"]) == 2
    assert "unknown policy 'oracle'" in capsys.readouterr().err
    assert main(["simulate", "testbed", "--out", str(tmp_path), "--requests", "maybe"]) == 2
    assert "requests must be one of" in capsys.readouterr().err


def test_a_zoo_without_profiles_is_refused(tmp_path, capsys):
    assert main(["simulate", "testbed", "--zoo", str(tmp_path / "empty")]) == 2
    assert "no profiled families" in capsys.readouterr().err
