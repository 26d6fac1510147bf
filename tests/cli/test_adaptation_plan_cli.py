"""``failsoft bench adaptation-plan``: one JSON object on stdout (the solver's banner kept out of it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_bench_adaptation_plan_prints_the_contract_keys() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "failsoft", "bench", "adaptation-plan", "--seeds", "1", "--milp-time-s", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # fails if anything else reached stdout
    sizes = result["sizes"]
    assert [(s["workers"], s["clients"]) for s in sizes] == [(2, 8), (4, 16), (8, 32)]
    for size in sizes:
        keys = {"workers", "clients", "heuristic_ms", "heuristic_objective", "milp_objective", "ratio"}
        assert keys <= set(size)
        (run,) = size["runs"]
        assert run["heuristic_served_fps"] == run["milp_served_fps"]
        assert size["ratio"] >= 0.98
        assert size["ratio_to_bound"] <= size["ratio"] + 1e-9
