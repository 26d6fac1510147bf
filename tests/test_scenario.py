import copy
import json

import pytest

from failsoft.errors import ConfigError
from failsoft.scenario import load_scenario, scenario_from_dict, scenario_to_dict

DESIGN_EXAMPLE = {
    "servers": [
        {"name": "s1", "site": "edge-a", "memory_mb": 16384, "compute": 1.0},
        {"name": "s2", "site": "edge-b", "memory_mb": 8192, "compute": 1.0},
    ],
    "families": {
        "convnext": [
            {
                "variant": "convnext_tiny",
                "memory_mb": 330,
                "accuracy": 0.821,
                "load_ms": 441,
                "latency_ms": 4.2,
            },
            {
                "variant": "convnext_large",
                "memory_mb": 980,
                "accuracy": 0.844,
                "load_ms": 2105,
                "latency_ms": 11.0,
            },
        ]
    },
    "apps": [
        {
            "name": "cam-1",
            "family": "convnext",
            "primary": {"server": "s1", "variant": "convnext_large"},
            "critical": True,
            "rate_rps": 10,
            "slo_ms": 100,
        }
    ],
    "policy": {"alpha": 0.1, "site_independent": True, "warm_replicas": 1},
}


def test_design_example_loads_into_the_domain_model():
    sc = scenario_from_dict(DESIGN_EXAMPLE)
    assert [s.name for s in sc.servers] == ["s1", "s2"]
    fam = sc.family("convnext")
    assert fam.smallest.name == "convnext_tiny" and fam.largest.name == "convnext_large"
    app = sc.app("cam-1")
    assert app.primary.server == "s1" and app.critical and app.slo_ms == 100
    assert sc.policy.site_independent and sc.warm is None
    # compute demand = rate * latency / 1000
    assert sc.used()["s1"].compute == pytest.approx(10 * 11.0 / 1000)


def test_round_trip_through_json(tmp_path):
    sc = scenario_from_dict(DESIGN_EXAMPLE)
    path = tmp_path / "sc.json"
    path.write_text(json.dumps(scenario_to_dict(sc)))
    again = load_scenario(path)
    assert again.servers == sc.servers and again.apps == sc.apps and again.policy == sc.policy
    assert again.families == sc.families


def _broken(mutate) -> dict:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["servers"][1].pop("memory_mb"), "servers[1] ('s2'): missing required field 'memory_mb'"),
        (
            lambda d: d["servers"][0].update(memory_mb=-5),
            "servers[0] ('s1').memory_mb: Input should be greater than or equal to 0 (got -5)",
        ),
        (lambda d: d["servers"][1].update(compute=-1), "(got -1)"),
        (lambda d: d["apps"][0].update(family="resnet"), "apps[0] 'cam-1': unknown family 'resnet'"),
        (
            lambda d: d["apps"][0]["primary"].update(server="s9"),
            "apps[0] 'cam-1': primary server 's9' does not exist",
        ),
        (lambda d: d["apps"][0]["primary"].update(variant="convnext_xl"), "has no variant 'convnext_xl'"),
        (lambda d: d["servers"].append(dict(d["servers"][0])), "duplicate server name 's1'"),
        (lambda d: d["apps"].append(dict(d["apps"][0])), "duplicate app name 'cam-1'"),
        (
            lambda d: d["families"]["convnext"].append(dict(d["families"]["convnext"][0])),
            "duplicate variant of family 'convnext' name 'convnext_tiny'",
        ),
        (lambda d: d["families"]["convnext"][0].update(accuracy=82.1), "less than or equal to 1"),
        (lambda d: d["servers"][0].update(colour="red"), "unknown field 'colour'"),
        (lambda d: d["policy"].update(alpha=1.5), "policy.alpha"),
        (
            lambda d: d.update(warm=[{"app": "cam-9", "variant": "convnext_tiny", "server": "s2"}]),
            "warm[0]: unknown app 'cam-9'",
        ),
    ],
)
def test_bad_scenarios_are_refused_with_one_message_naming_the_entry(mutate, expected):
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(_broken(mutate))
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": [}')
    with pytest.raises(ConfigError, match=r"not valid JSON.*line 1"):
        load_scenario(bad)
    top = tmp_path / "list.json"
    top.write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_scenario(top)
