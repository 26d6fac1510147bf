"""What every simulator experiment writes: one writer, strict JSON, the three paths."""

from __future__ import annotations

import json
import math

from failsoft.sim.output import write_experiment


def test_every_experiment_writes_strict_json_csv_and_its_figure(tmp_path):
    drawn = []
    rows = [{"policy": "a", "miss_rate": 0.1}, {"policy": "b", "miss_rate": math.nan}]
    summary = {"by_policy": {"a": {"miss_rate": 0.1}, "b": {"miss_rate": math.nan, "p99": math.inf}}}
    paths = write_experiment(rows, ["policy", "miss_rate"], summary, tmp_path / "out", "x.png", drawn.append)
    text = (tmp_path / "out" / "summary.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN literal
    assert doc["by_policy"]["b"] == {"miss_rate": None, "p99": None}
    assert (tmp_path / "out" / "results.csv").read_text().splitlines()[2] == "b,nan"
    assert drawn == [tmp_path / "out" / "x.png"] and paths["figure"] == str(tmp_path / "out" / "x.png")
