"""``failsoft plan``: JSON in, JSON out, in the shapes docs/scenario.md gives; one-line errors, exit 2."""

import json
import subprocess
import sys

import pytest

from failsoft.cli import main
from failsoft.profiles import load_profile_families
from failsoft.scenario import scenario_to_dict
from failsoft.synth import ClusterShape, synthesize


@pytest.fixture
def scenario_file(tmp_path):
    scenario = synthesize(load_profile_families(), ClusterShape(9, 3, 40, headroom=0.2), seed=11)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario_to_dict(scenario)))
    return path, scenario


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_proactive_prints_the_design_shape(capsys, scenario_file):
    path, scenario = scenario_file
    code, out, _ = run(capsys, "plan", "proactive", str(path))
    assert code == 0
    plan = json.loads(out)
    assert {"warm", "unplaced", "objective", "solve_ms"} <= set(plan)
    critical = {a.name for a in scenario.apps if a.critical}
    assert {w["app"] for w in plan["warm"]} | set(plan["unplaced"]) == critical
    for w in plan["warm"]:
        assert set(w) == {"app", "variant", "server"}


@pytest.mark.parametrize("policy", ["faillite", "full-warm", "full-cold", "full-warm-k"])
def test_plan_failover_for_servers_and_sites(capsys, scenario_file, policy):
    path, scenario = scenario_file
    code, out, _ = run(
        capsys, "plan", "failover", str(path), "--failed", "s0", "--failed", "s1", "--policy", policy
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["failed"] == ["s0", "s1"]
    affected = {a.name for a in scenario.apps if a.primary.server in ("s0", "s1")}
    assert {a["app"] for a in plan["actions"]} | set(plan["unrecovered"]) == affected
    for action in plan["actions"]:
        assert {"app", "kind", "server", "first_variant", "final_variant"} <= set(action)
        assert action["server"] not in ("s0", "s1")
    code, out, _ = run(capsys, "plan", "failover", str(path), "--site", "site-00", "--policy", policy)
    assert code == 0
    assert set(json.loads(out)["failed"]) == set(scenario.servers_in_sites(["site-00"]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "failover", "{path}", "--failed", "nope"], "failed server 'nope' is not in the scenario"),
        (["plan", "failover", "{path}", "--site", "mars"], "failed site 'mars'"),
        (["plan", "failover", "{path}"], "name at least one failed server"),
        (["plan", "proactive", "{path}", "--policy", "magic"], "unknown failover policy 'magic'"),
        (["plan", "proactive", "/no/such/file.json"], "cannot read scenario"),
    ],
)
def test_errors_are_one_line_and_exit_2(capsys, scenario_file, argv, message):
    path, _ = scenario_file
    code, out, err = run(capsys, *[a.format(path=path) for a in argv])
    assert code == 2
    assert out == ""
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_console_script_runs_on_a_scenario_it_has_never_seen(tmp_path):
    data = {
        "servers": [
            {"name": n, "site": s, "memory_mb": 2000} for n, s in [("a", "x"), ("b", "y"), ("c", "y")]
        ],
        "families": {
            "m": [
                {"variant": "small", "memory_mb": 100, "accuracy": 0.7, "load_ms": 50, "latency_ms": 2},
                {"variant": "big", "memory_mb": 900, "accuracy": 0.8, "load_ms": 900, "latency_ms": 9},
            ]
        },
        "apps": [
            {
                "name": "cam",
                "family": "m",
                "primary": {"server": "a", "variant": "big"},
                "critical": True,
                "rate_rps": 5,
                "slo_ms": 50,
            }
        ],
        "policy": {"alpha": 0.1, "site_independent": True, "warm_replicas": 1},
    }
    path = tmp_path / "new.json"
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "failsoft", "plan", "failover", str(path), "--failed", "a"],
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads(done.stdout)
    (action,) = plan["actions"]
    assert action["kind"] == "warm" and action["server"] in ("b", "c") and action["final_variant"] == "big"
