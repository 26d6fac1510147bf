"""What ships in examples/ works as the README and docs/scenario.md use it.

Every example config must deploy on CPU and on CUDA machines alike. Its primaries are resolved
(``runtime.deployment.resolve``, what ``failsoft serve`` checks before starting anything) against
profiles estimated from the bundled data, on the high side: the published weight size of each
variant (``data/profiles/torchvision_imagenet_accuracy.csv``; the digits models' parameter counts),
plus the largest resident-set growth beyond the weights the zoo measured for that kind of model
(ResNet-50: 43.4 MB at 224 px; the digits CNN: 4.3 MB), plus, on CUDA, the ~33 MB each model took
beyond its CPU growth on an H100; all with a 5 % margin.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from failsoft.cli import main
from failsoft.domain import Family, Variant
from failsoft.errors import ConfigError
from failsoft.runtime.config import load_config
from failsoft.runtime.deployment import resolve
from failsoft.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RSS_OVER_WEIGHTS_MB = {"declared": 45.0, "trained": 5.0, "stateful": 5.0}  # ImageNet-style / small models
CUDA_PER_MODEL_MB = 33.0
MARGIN = 1.05


@cache
def _weights_mb() -> dict[tuple[str, str], tuple[str, float]]:
    """(family, variant) -> (family kind, weight MB) for every variant the zoo can build."""
    from failsoft.zoo.catalog import FAMILIES, published
    from failsoft.zoo.digits import build_digits_module
    from failsoft.zoo.stateful import build_stateful_module, is_stateful_arch

    sizes = {}
    for fam in FAMILIES:
        for v in fam.variants:
            if v.published_as:
                mb = published()[v.published_as].weights_file_size_mb
            else:
                build = build_stateful_module if is_stateful_arch(v.arch) else build_digits_module
                module = build(v.arch, v.architecture())
                mb = sum(p.numel() for p in module.parameters()) * 4 / 1e6
            sizes[fam.name, v.name] = (fam.kind, mb)
    return sizes


def _families(cuda: bool) -> tuple[Family, ...]:
    by_family: dict[str, list[Variant]] = {}
    for (family, variant), (kind, weights) in _weights_mb().items():
        memory = (weights + RSS_OVER_WEIGHTS_MB[kind] + (CUDA_PER_MODEL_MB if cuda else 0.0)) * MARGIN
        by_family.setdefault(family, []).append(Variant(variant, memory, 0.8, 100.0, 1.0))
    # a parity model has its deployed variant's architecture (ParM 4.1): the same weights' size
    for (family, variant), (kind, weights) in _weights_mb().items():
        memory = (weights + RSS_OVER_WEIGHTS_MB[kind] + (CUDA_PER_MODEL_MB if cuda else 0.0)) * MARGIN
        for encoder, k, r in (("add", 2, 1), ("add", 3, 1), ("add", 4, 1), ("concat", 2, 1), ("add", 2, 2)):
            for index in range(r):
                name = f"{variant}_{encoder}_k{k}_r{r}_p{index}"
                by_family.setdefault(f"{family}_parity", []).append(Variant(name, memory, 0.8, 100.0, 1.0))
    return tuple(Family(name, tuple(variants)) for name, variants in by_family.items())


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
@pytest.mark.parametrize(
    "path", sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "llm.yaml"), ids=lambda p: p.name
)
def test_every_example_config_deploys_with_a_margin(path, cuda):  # llm.yaml: tests/runtime/test_config.py
    config = load_config(path)
    deployed = resolve(config, _families(cuda))
    assert {a.name for a in deployed.apps} == {a.name for a in config.apps}


def test_the_old_bench_capacity_was_refused_with_cuda_profiles():
    config = load_config(EXAMPLES / "bench.yaml")
    servers = tuple(type(s)(s.name, s.site, 1500.0, s.compute) for s in config.servers)
    with pytest.raises(ConfigError, match="does not fit on server 'a1'"):
        resolve(config.replace(servers=servers), _families(cuda=True))


def test_examples_scenario_plans_as_the_docs_show(capsys):
    scenario = load_scenario(EXAMPLES / "scenario.json")
    assert {"a1", "edge-b"} <= {s.name for s in scenario.servers} | {s.site for s in scenario.servers}
    assert main(["plan", "proactive", str(EXAMPLES / "scenario.json")]) == 0
    warm = json.loads(capsys.readouterr().out)["warm"]
    assert {w["app"] for w in warm} == {a.name for a in scenario.apps if a.critical}
    assert main(["plan", "failover", str(EXAMPLES / "scenario.json"), "--failed", "a1"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {a["app"] for a in plan["actions"]} == {a.name for a in scenario.apps if a.primary.server == "a1"}
    assert plan["unrecovered"] == []
    argv = ["plan", "failover", str(EXAMPLES / "scenario.json"), "--site", "edge-b", "-p", "full-warm-k"]
    assert main(argv) == 0
    assert set(json.loads(capsys.readouterr().out)["failed"]) == {"b1", "b2"}


def test_examples_scenario_carries_measured_profiles():
    scenario = load_scenario(EXAMPLES / "scenario.json")
    assert {f.name for f in scenario.families} == {"digits_mlp", "digits_cnn"}
    for family in scenario.families:
        assert all(v.accuracy_source == "measured" and v.batch_latency_ms for v in family.variants)
    used = {s.name: 0.0 for s in scenario.servers}
    for app in scenario.apps:
        used[app.primary.server] += scenario.family(app.family).variant(app.primary.variant).memory_mb
    for server in scenario.servers:  # the demo's capacities: primaries fill 70 % of each server
        assert used[server.name] / server.memory_mb == pytest.approx(0.7, abs=0.01)


def test_examples_request_is_a_held_out_digit_the_gateway_accepts():
    from failsoft.runtime.gateway.protocol import ModelMeta, parse_infer_request
    from failsoft.zoo.digits import load_digits_split

    raw = (EXAMPLES / "request.json").read_bytes()
    request = parse_infer_request(raw, "cam-1", ModelMeta((64,), 10), 64)
    split = load_digits_split()
    np.testing.assert_array_equal(request.batch[0], split.x_test[0])
    assert request.classification == 3
    assert f"label {split.y_test[0]}" in json.loads(raw)["id"]


DOC = Path(__file__).resolve().parents[2] / "docs" / "scenario.md"


def test_the_schema_doc_example_is_a_valid_scenario():
    import re

    from failsoft.scenario import scenario_from_dict

    block = re.search(r"```json\n(.*?)```", DOC.read_text(), re.S).group(1)
    scenario = scenario_from_dict(json.loads(block))
    assert scenario.warm and scenario.family("convnext").variant("convnext_large").batch_latency_ms


def test_the_schema_doc_names_every_field_of_every_section():
    import dataclasses

    from failsoft.domain import PolicyParams
    from failsoft.scenario import AppSpec, ScenarioSpec, ServerSpec, ServiceSpec, VariantSpec, WarmSpec
    from failsoft.services import PARAMS_OF_MODE

    text = DOC.read_text()
    fields = [*ScenarioSpec.model_fields, *ServerSpec.model_fields, *VariantSpec.model_fields]
    fields += [*AppSpec.model_fields, *WarmSpec.model_fields, *ServiceSpec.model_fields]
    fields += [f.name for f in dataclasses.fields(PolicyParams)]
    for mode, params in PARAMS_OF_MODE.items():
        assert f"`{mode.value}`" in text
        fields += [f.name for f in dataclasses.fields(params)]
    missing = [name for name in fields if f"`{name}`" not in text]
    assert missing == []
