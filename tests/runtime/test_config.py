"""The serving config: one clear line for every mistake, before anything starts (no Ray here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from failsoft.domain import Family, Placement, Variant
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict, load_config
from failsoft.runtime.demo import EDGE_YAML
from failsoft.runtime.deployment import resolve

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def base() -> dict:
    return {
        "name": "t",
        "servers": [
            {"name": "s1", "site": "a", "memory_mb": 100},
            {"name": "s2", "site": "b", "memory_mb": 60},
        ],
        "apps": [
            {"name": "x", "family": "fam", "critical": True, "rate_rps": 2, "primary": {"server": "s1"}},
            {"name": "y", "family": "fam"},
        ],
    }


FAM = Family(
    "fam",
    (
        Variant("small", 10, 0.80, 5, 1.0),
        Variant("mid", 20, 0.85, 10, 2.0),
        Variant("big", 50, 0.90, 30, 40.0),
    ),
)


def test_defaults_follow_faillite_and_design():
    cfg = config_from_dict(base())
    assert cfg.heartbeat.interval_s == pytest.approx(0.020)
    assert cfg.heartbeat.missed_to_fail == 2
    assert (cfg.gateway.host, cfg.gateway.port) == ("127.0.0.1", 8000)
    assert cfg.policy == "faillite" and cfg.store_url == "sqlite"
    assert cfg.apps[0].server == "s1" and cfg.apps[0].variant is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["servers"][0].update(memory_mb=-1),
            "servers[0] ('s1').memory_mb: Input should be greater than 0 (got -1)",
        ),
        (lambda d: d["servers"][1].update(colour="red"), "servers[1] ('s2'): unknown field 'colour'"),
        (lambda d: d["apps"][1].pop("family"), "apps[1] ('y'): missing required field 'family'"),
        (lambda d: d["apps"].append(dict(d["apps"][0])), "duplicate app name 'x'"),
        (
            lambda d: d["apps"][0]["primary"].update(server="s9"),
            "apps[0] ('x'): primary server 's9' does not exist",
        ),
        (
            lambda d: d.update(failover={"policy": "magic"}),
            "failover.policy: unknown failover policy",
        ),
        (lambda d: d.update(store="mysql://x"), "store: store must be"),
        (
            lambda d: d.update(heartbeat={"interval_ms": 0}),
            "heartbeat.interval_ms: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d.update(agents={"torch_threads": -1}),
            "agents.torch_threads: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_config_is_one_line_naming_the_entry(change, expected):
    data = base()
    change(data)
    with pytest.raises(ConfigError) as err:
        config_from_dict(data, source="c.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("c.yaml: ")
    assert expected in message


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("servers: [\n  {name: s1\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML: .* at line \d+"):
        load_config(path)


def test_resolve_places_open_primaries_worst_fit_on_the_best_variant_in_slo():
    cfg = config_from_dict(base() | {"apps": [*base()["apps"], {"name": "z", "family": "fam", "slo_ms": 5}]})
    scenario = resolve(cfg, [FAM])
    placed = {a.name: a.primary for a in scenario.apps}
    assert placed["x"] == Placement("s1", "big")  # pinned server, most accurate variant
    assert placed["y"] == Placement("s2", "big")  # worst fit: s2 has 60 MB free, s1 only 50
    assert placed["z"].variant == "mid"  # the most accurate variant within its 5 ms SLO


def test_resolve_refuses_what_does_not_fit_or_does_not_exist():
    data = base()
    data["apps"][0]["primary"] = {"server": "s2", "variant": "big"}
    data["servers"][1]["memory_mb"] = 40
    with pytest.raises(ConfigError, match=r"app 'x': variant 'big' \(50 MB.*does not fit on server 's2'"):
        resolve(config_from_dict(data), [FAM])
    data = base()
    data["apps"][1]["family"] = "nope"
    with pytest.raises(
        ConfigError, match=r"apps\[1\] \('y'\): family 'nope' is not in the .* \(it has: fam\)"
    ):
        resolve(config_from_dict(data), [FAM])


LLM_EXAMPLES = ("llm.yaml",)  # LUMEN: an llm service only (no app of the model repository)


@pytest.mark.parametrize(
    "path", sorted(p for p in EXAMPLES.glob("*.yaml") if p.name not in LLM_EXAMPLES), ids=lambda p: p.name
)
def test_every_example_config_is_valid(path):
    cfg = load_config(path)
    assert cfg.servers and cfg.apps


@pytest.mark.parametrize("name", LLM_EXAMPLES)
def test_every_example_llm_config_is_valid(name):
    cfg = load_config(EXAMPLES / name)
    (llm,) = cfg.llm
    assert llm.service.members == ("w0", "w1", "w2") and llm.servers == ("s1", "s2", "s3")
    assert llm.policy == "lumen" and not cfg.apps


def _llm_config(**service):
    return {
        "servers": [{"name": "s1", "site": "a", "memory_mb": 64}],
        "services": [{"name": "bytes", "mode": "llm", **service}],
    }


@pytest.mark.parametrize(
    ("service", "named"),
    [
        (
            {"params": {"checkpoint_budget_mb": -1}},
            r"services\[0\] \('bytes'\)\.params: .*checkpoint_budget_mb",
        ),
        ({"policy": "nope"}, r"policy 'nope' is unknown \(known: .*lumen"),
        ({"servers": ["s9"]}, r"servers: 's9' is not a server"),
        ({"workers": 0}, "workers"),
        ({"model": {"path": "/no/such/dir"}}, "not a Hugging Face model directory"),
        ({"model": {"draft": "/x"}}, "model.draft needs model.path"),
        ({"members": ["a"]}, "members"),  # an llm service's members are its workers
    ],
)
def test_an_llm_service_is_validated_at_the_edge(service, named):
    with pytest.raises(ConfigError, match=named):
        config_from_dict(_llm_config(**service))


def _stored_lm(where: Path, weights_bytes: int, load_ms: float | None) -> None:
    """A built model's files as the footprint reads them (config and profile; no weights needed)."""
    import json

    where.mkdir(parents=True)
    arch = {"num_attention_heads": 4, "hidden_size": 64, "num_key_value_heads": 2, "num_hidden_layers": 2}
    config = {"architecture": arch, "weights": {"file": "model.safetensors", "bytes": weights_bytes}}
    (where / "config.json").write_text(json.dumps(config))
    if load_ms is not None:
        (where / "profile.json").write_text(json.dumps({"load_ms": load_ms}))


def test_an_llm_workers_memory_is_its_weights_and_kv_budget_and_its_restart_its_profile(tmp_path):
    _stored_lm(tmp_path / "llm" / "tiny-target", 3 * 2**20, 800.0)
    _stored_lm(tmp_path / "llm" / "tiny-draft", 2**20, None)
    service = {"model": {"root": str(tmp_path)}, "workers": 2, "spares": 1, "restart_delay_ms": 200}
    service["engine"] = {"kv_pages": 64, "page_size": 16}
    (llm,) = config_from_dict(_llm_config(**service)).llm
    group = llm.group(progressive=True)
    # KV: 2 (K, V) x 2 layers x 2 KV heads x 16 (64 / 4 heads) x 4 bytes = 512 B a token, 1024 tokens
    assert group.memory_mb == 3 + 1 + 0.5
    assert (group.workers, group.homes, group.standbys) == (("w0", "w1"), ("s1", "s1"), ("s1",))
    assert group.draft_first and group.target_load_s == pytest.approx(1.0)  # profile + delay
    assert group.draft_load_s == pytest.approx(1 / 500)  # no profile: its weights read at 500 MB/s
    plain = llm.group(progressive=False)
    assert plain.memory_mb == 3.5 and not plain.draft_first


def test_a_config_that_serves_nothing_is_refused():
    with pytest.raises(ConfigError, match="serves nothing"):
        config_from_dict({"servers": [{"name": "s1", "site": "a", "memory_mb": 64}]})


def test_an_llm_service_cannot_take_an_apps_name():
    data = _llm_config()
    data["apps"] = [{"name": "bytes", "family": "fam"}]
    with pytest.raises(ConfigError, match=r"'bytes'.*taken"):
        config_from_dict(data)


def test_the_demo_serves_examples_edge_yaml():
    assert yaml.safe_load((EXAMPLES / "edge.yaml").read_text()) == yaml.safe_load(EDGE_YAML)
    cfg = load_config(EXAMPLES / "edge.yaml")
    assert len(cfg.servers) == 6 and len(cfg.sites) == 3 and len(cfg.apps) == 12


def test_the_admin_plane_defaults_to_loopback_on_the_next_port():
    g = config_from_dict(base()).gateway
    assert (g.url, g.admin_url, g.tls, g.admin_tls) == (
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8001",
        None,
        None,
    )
    assert config_from_dict({**base(), "gateway": {"port": 0}}).gateway.admin_bind_port == 0  # any free port
    g = config_from_dict({**base(), "gateway": {"host": "::1", "admin_port": 9100}}).gateway
    assert (g.url, g.admin_url) == ("http://[::1]:8000", "http://127.0.0.1:9100")


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [
        ({"admin_port": 8000}, "gateway.admin_port 8000 is the inference port"),
        ({"port": 65535}, "gateway.port 65535 leaves no port + 1 for the admin API"),
        ({"tls": {"certfile": "nope.pem", "keyfile": "k.pem"}}, "gateway.tls.certfile: no such file"),
        ({"admin_tls": {"certfile": "c.pem"}}, "gateway.admin_tls: missing required field 'keyfile'"),
    ],
)
def test_a_bad_admin_plane_or_tls_setting_is_refused(gateway, expected, tmp_path):
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ConfigError, match=expected.replace("+", r"\+")):
        config_from_dict({**base(), "gateway": gateway}, base_dir=tmp_path)


def test_tls_files_are_read_before_anything_starts(tmp_path):
    from failsoft.runtime.security import check_tls

    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    tls = {"certfile": "c.pem", "keyfile": "k.pem"}
    g = config_from_dict({**base(), "gateway": {"tls": tls}}, base_dir=tmp_path).gateway
    assert g.url.startswith("https://") and g.tls is not None and g.tls.certfile == tmp_path / "c.pem"
    says = r"gateway\.tls: cannot use certfile .*c\.pem' with keyfile .*k\.pem'"
    with pytest.raises(ConfigError, match=says):
        check_tls(g.tls, "gateway.tls")
