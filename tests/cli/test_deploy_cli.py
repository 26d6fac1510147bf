"""``failsoft deploy`` as a person meets it: one line and exit status 2 for a config that cannot be
sent, the plan and its outcome described line by line; and the stored deployment's round trip."""

from __future__ import annotations

from failsoft.cli import main
from failsoft.cli.deploy import describe
from failsoft.scenario import scenario_from_dict, scenario_to_dict
from tests.orchestration.test_core import cluster


def test_bad_yaml_is_one_line_and_exit_status_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("apps: [\n  - {name: x\n")
    assert main(["deploy", str(path), "--admin-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: config") and "not valid YAML" in err[0]


def test_a_config_the_schema_refuses_never_reaches_the_cluster(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        "servers: [{name: s1, site: a, memory_mb: 10}]\napps: [{name: x, family: f, colour: red}]\n"
    )
    assert main(["deploy", str(path), "--admin-url", "http://127.0.0.1:9"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "colour" in line


def test_the_plan_and_its_outcome_are_described_line_by_line():
    answer = {
        "changed": True,
        "version": 3,
        "plan": {
            "empty": False,
            "steps": [
                {"kind": "remove", "app": "c", "old": [{"server": "s3", "variant": "v"}], "new": None},
                {
                    "kind": "move",
                    "app": "b",
                    "old": [{"server": "s1", "variant": "v"}],
                    "new": {"server": "s2", "variant": "w"},
                },
            ],
            "changed": ["a"],
            "services_added": [],
            "services_removed": ["c"],
            "policy_changed": True,
        },
        "notes": [],
    }
    done = {"last": {"started_at": 10.0, "finished_at": 11.5, "rolled_back": {"b": "why"}, "unserved": []}}
    lines = describe(answer, done)
    assert lines[0] == "config version 3:"
    assert "  remove c: s3/v -> -" in lines and "  move   b: s1/v -> s2/w" in lines
    assert "done in 1.50 s" in lines and "  rolled back b: why" in lines
    empty = describe({"version": 3, "plan": {"empty": True}}, None)
    assert empty == ["nothing to change: config version 3 already serves it"]


def test_a_deployment_survives_the_store_round_trip():
    scenario = cluster().replace(warm=None)
    assert scenario_from_dict(scenario_to_dict(scenario)) == scenario


def test_status_shows_the_config_version_served():
    from rich.console import Console

    from failsoft.cli.status import _contract, server_table

    body = {
        "cluster": "edge",
        "policy": "faillite",
        "version": 7,
        "config": {"version": 3, "digest": "abc", "last": {"state": "running"}},
        "servers": [],
        "apps": [],
    }
    assert _contract(body)["config"] == {"version": 3, "digest": "abc", "deploy": "running"}
    console = Console(record=True, width=200)
    console.print(server_table(body))
    assert "config v3 deploying" in console.export_text()
