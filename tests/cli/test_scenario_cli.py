"""``failsoft scenario CONFIG.yaml``: a serving config's scenario, with the zoo's measured profiles,
that ``failsoft plan`` reads as it is."""

from __future__ import annotations

import json

import pytest
import yaml

from failsoft.cli import main
from failsoft.scenario import scenario_from_dict


@pytest.fixture
def config_file(tiny_zoo, tmp_path):
    data = {
        "name": "scn",
        "repository": str(tiny_zoo.root),
        "servers": [
            {"name": "s1", "site": "a", "memory_mb": 30},
            {"name": "s2", "site": "b", "memory_mb": 30, "compute": 2.0},
            {"name": "s3", "site": "b", "memory_mb": 30},
        ],
        "apps": [
            {
                "name": "cam",
                "family": "digits_mlp",
                "critical": True,
                "rate_rps": 5,
                "primary": {"server": "s1"},
            },
            {"name": "ocr", "family": "digits_mlp", "slo_ms": 50, "primary": {"variant": "mlp_m"}},
            {"name": "w1", "family": "digits_mlp", "primary": {"server": "s3", "variant": "mlp_s"}},
            {"name": "w2", "family": "digits_mlp", "primary": {"server": "s3", "variant": "mlp_xs"}},
        ],
        "services": [{"name": "pool", "mode": "slo", "members": ["w1", "w2"], "params": {"slo_ms": 80}}],
        "failover": {"policy": "faillite", "alpha": 0.2, "site_independent": True},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_scenario_of_a_config_has_its_servers_placements_profiles_and_services(
    config_file, tiny_zoo, capsys
):
    assert main(["scenario", str(config_file)]) == 0
    doc = json.loads(capsys.readouterr().out)
    scenario = scenario_from_dict(doc)
    assert [(s.name, s.site, s.memory_mb, s.compute) for s in scenario.servers] == [
        ("s1", "a", 30, 1.0),
        ("s2", "b", 30, 2.0),
        ("s3", "b", 30, 1.0),
    ]
    placed = {a.name: (a.primary.server, a.primary.variant) for a in scenario.apps}
    assert placed["cam"] == ("s1", "mlp_l")  # the most accurate variant, no SLO
    assert placed["ocr"] == ("s2", "mlp_m")  # worst fit: the emptiest server
    assert placed["w1"] == ("s3", "mlp_s")
    measured = {v.name: v for v in tiny_zoo.families(["digits_mlp"])[0].variants}
    for variant in scenario.family("digits_mlp").variants:
        assert variant.memory_mb == measured[variant.name].memory_mb
        assert variant.batch_latency_ms == measured[variant.name].batch_latency_ms
    (service,) = scenario.services
    assert (service.name, service.mode.value, service.members) == ("pool", "slo", ("w1", "w2"))
    assert service.params.slo_ms == 80
    assert scenario.policy.alpha == 0.2 and scenario.policy.site_independent
    assert scenario.warm is None  # the planners choose warm backups themselves


def test_plan_reads_the_written_scenario(config_file, tmp_path, capsys):
    out = tmp_path / "scn.json"
    assert main(["scenario", str(config_file), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().err
    assert main(["plan", "failover", str(out), "--failed", "s1"]) == 0
    (action,) = json.loads(capsys.readouterr().out)["actions"]
    assert action["app"] == "cam" and action["server"] in ("s2", "s3")


def test_another_repository_and_the_errors(config_file, tmp_path, capsys):
    assert main(["scenario", str(config_file), "--repository", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "model repository" in err and "does not exist" in err and "failsoft zoo build" in err
    (tmp_path / "empty").mkdir()
    assert main(["scenario", str(config_file), "--repository", str(tmp_path / "empty")]) == 2
    assert "family 'digits_mlp' is not in the model repository" in capsys.readouterr().err
    assert main(["scenario", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err
