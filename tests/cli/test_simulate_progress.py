"""``failsoft simulate`` says how far it is, point by point, and where it wrote its files."""

from __future__ import annotations

import json
import re

from failsoft.cli import main


def test_progress_per_point_and_the_paths_at_the_end(tmp_path, capsys):
    out = tmp_path / "tb"
    assert main(["simulate", "testbed", "--seeds", "2", "--out", str(out), "-p", "faillite"]) == 0
    stdout, stderr = capsys.readouterr()
    digest = json.loads(stdout)  # stdout stays one JSON document
    lines = stderr.splitlines()
    progress = [line for line in lines if line.startswith("[")]
    points = len({re.match(r"\[(\d+)/", line).group(1) for line in progress})
    assert points == int(re.match(r"\[\d+/(\d+)\]", progress[0]).group(1)) > 1
    assert len(progress) == 2 * points  # each point, once per seed
    assert progress[-1].startswith(f"[{points}/{points}] testbed ") and "seed 2 of 2 done" in progress[-1]
    tail = lines[lines.index(next(line for line in lines if line.startswith("simulate testbed:"))) :]
    written = [line.strip() for line in tail[1:]]
    assert written == [str(out / "results.csv"), str(out / "summary.json"), str(out / "testbed.png")]
    assert sorted(digest["outputs"].values()) == sorted(written)
    assert all((out / name).is_file() for name in ("results.csv", "summary.json", "testbed.png"))
