"""One repository for every command, and the models a benchmark needs built on its first use.

Real files throughout: configs from ``examples/``, a real (tiny) repository, a parity model really
trained (one epoch: what is tested is that it is stored where the session looks, not its accuracy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from failsoft.bench.cluster import read_bench_config
from failsoft.bench.models import ensure_models
from failsoft.runtime.config import config_from_dict, load_config
from failsoft.runtime.session import prepare
from failsoft.zoo import ModelRepository, resolve_repository
from failsoft.zoo.parity import ParityCode, ParityTraining

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_a_config_without_repository_uses_the_default_one(monkeypatch, tmp_path):
    monkeypatch.setenv("FAILSOFT_ZOO", str(tmp_path / "zoo"))
    config = load_config(EXAMPLES / "graph-auto-pilot.yaml")
    assert config.repository == tmp_path / "zoo" == resolve_repository()
    # bench replication once formatted None here: "no variant sp500_gru/gru_16 in repository 'None'"
    data = read_bench_config(EXAMPLES / "graph-auto-pilot.yaml", None)
    assert config_from_dict(data, base_dir=EXAMPLES).repository == tmp_path / "zoo"


def test_a_config_s_repository_wins_and_resolves_against_its_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("FAILSOFT_ZOO", str(tmp_path / "elsewhere"))
    data = read_bench_config(EXAMPLES / "edge.yaml", None) | {"repository": "models"}
    assert config_from_dict(data, base_dir=tmp_path).repository == tmp_path / "models"


def test_a_bench_root_resolves_from_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    data = read_bench_config(EXAMPLES / "coded.yaml", "zoo")
    assert config_from_dict(data, base_dir=EXAMPLES).repository == tmp_path / "zoo"
    assert data["gateway"]["port"] == 0


@pytest.mark.slow  # trains (one epoch) and profiles a parity model
def test_a_coded_config_gets_its_parity_model_on_first_use(tiny_zoo, tmp_path):
    root = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, root)
    data = read_bench_config(EXAMPLES / "coded.yaml", root) | {"state_dir": str(tmp_path / "state")}
    config = config_from_dict(data, base_dir=EXAMPLES)
    said: list[str] = []
    ensure_models(config, said.append, ParityTraining(epochs=1))
    assert len(said) == 1 and "digits_mlp_parity/mlp_m_add_k2_r1_p0" in said[0]  # the family was there
    prepare(config)  # what `failsoft serve` checks before anything starts: the parity model fits
    repo = ModelRepository(root)
    code = ParityCode("digits_mlp", "mlp_m", 2)
    assert repo.profile(code.parity_family, code.parity_variant)["latency_ms"] > 0
    said.clear()
    ensure_models(config, said.append)  # there now: nothing is trained again
    assert said == []


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_no_example_names_a_repository_the_commands_do_not_use(example):
    text = (EXAMPLES / example).read_text()
    assert "~/.failsoft" not in text, f"{example} tells users to build where no command looks"
