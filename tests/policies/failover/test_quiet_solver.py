"""HiGHS prints nothing on standard output, where ``failsoft plan`` writes its JSON."""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scenario.json"


def test_making_solvers_prints_nothing_on_stdout():
    code = (
        "from failsoft.policies.failover.milp import new_highs; "
        "new_highs(); new_highs(); print('only this', flush=True)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "only this\n"


def test_plan_proactive_stdout_is_json_alone():
    code = "import sys; from failsoft.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "plan", "proactive", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)  # a banner before the JSON would fail here
    assert plan["warm"]
