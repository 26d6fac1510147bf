"""``failsoft parity train --data``: a parity model for a user's ONNX classifier, trained from the
user's own inputs, exported as ONNX (or ``torch.export``), checked like the zoo's, and decoding the
deployed model's answers through its handler; a coded service over the user's family passes
``prepare`` (no Ray here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from failsoft.cli import main
from failsoft.errors import ConfigError
from failsoft.policies.registry import get_decoder, get_encoder
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import prepare
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.parity import ParityCode, check_parity
from failsoft.zoo.profiler import QUICK

pytestmark = pytest.mark.slow  # trains a parity model: seconds of CPU


@pytest.fixture(scope="module")
def user_zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRepository, Path]:
    out = tmp_path_factory.mktemp("user-parity")
    paths = examples.mlp_artefacts(out / "mlp")
    repo = ModelRepository(out / "zoo")
    add_variant(repo, AddRequest("mlp", "onnx", paths["onnx"], accuracy=0.9), QUICK)
    x = np.random.default_rng(0).normal(size=(800, examples.MLP_SIZES[0])).astype(np.float32)
    np.savez(out / "train.npz", x=x)  # inputs only: the deployed model's answers are the targets
    return repo, out / "train.npz"


def test_parity_train_with_data_stores_an_onnx_parity_model_that_decodes_the_deployed_answers(
    capsys, user_zoo
):
    repo, data = user_zoo
    argv = ["parity", "train", "mlp/onnx", "--data", str(data), "--root", str(repo.root)]
    assert main([*argv, "--epochs", "60", "--lr", "0.01", "--quick"]) == 0, capsys.readouterr().err
    (model,) = json.loads(capsys.readouterr().out)["parity_models"]
    assert (model["family"], model["variant"]) == ("mlp_parity", "onnx_add_k2_r1_p0")
    assert model["reconstruction"] > 0.8 and model["degraded_accuracy"] > 2 * model["default_accuracy"]
    config = repo.config("mlp_parity", "onnx_add_k2_r1_p0")
    assert config.model_format == "onnx" and config.weights_file == "model.onnx"
    check_parity(repo, "mlp_parity", "onnx_add_k2_r1_p0", ParityCode("mlp", "onnx", 2))

    queries = np.random.default_rng(1).normal(size=(2, 50, examples.MLP_SIZES[0])).astype(np.float32)
    with repo.load("mlp", "onnx") as deployed:
        answers = [deployed.predict(q) for q in queries]
    (parity_query,) = get_encoder("add", 2, 1, (examples.MLP_SIZES[0],)).encode(list(queries))
    with repo.load("mlp_parity", "onnx_add_k2_r1_p0") as parity:
        parity_answer = parity.predict(parity_query)
    decoded = get_decoder(2, 1).decode({0: answers[0], 2: parity_answer})  # member 1 unavailable
    assert decoded is not None
    assert np.mean(decoded[1].argmax(1) == answers[1].argmax(1)) > 0.7


def test_a_coded_service_over_the_user_family_is_accepted_and_a_wrong_code_refused(user_zoo, tmp_path):
    repo, _ = user_zoo
    if "onnx_add_k2_r1_p0" not in repo.variant_names("mlp_parity"):
        pytest.skip("needs the parity model of the test above")

    def config(encoder: str) -> object:
        homes = {
            "d0": ("s1", "mlp", "onnx"),
            "d1": ("s2", "mlp", "onnx"),
            "p0": ("s3", "mlp_parity", "onnx_add_k2_r1_p0"),
        }
        return config_from_dict(
            {
                "name": "user-coded",
                "repository": str(repo.root),
                "servers": [
                    {"name": s, "site": s, "memory_mb": 4000, "compute": 4.0} for s in ("s1", "s2", "s3")
                ],
                "apps": [
                    {"name": a, "family": f, "primary": {"server": s, "variant": v}}
                    for a, (s, f, v) in homes.items()
                ],
                "services": [
                    {
                        "name": "mlp",
                        "mode": "coded",
                        "members": ["d0", "d1", "p0"],
                        "params": {"k": 2, "r": 1, "encoder": encoder},
                    }
                ],
                "state_dir": str(tmp_path / "state"),
            },
            source="test",
        )

    assert prepare(config("add")).deployment is not None
    with pytest.raises(ConfigError, match=r"parity member 'p0'.*encoder differs"):
        prepare(config("concat"))


def test_parity_as_torch_export_and_bad_data_refused(capsys, user_zoo, tmp_path):
    repo, data = user_zoo
    root = str(repo.root)
    argv = [
        "parity",
        "train",
        "mlp/onnx",
        "--data",
        str(data),
        "--root",
        root,
        "--no-profile",
        "--epochs",
        "2",
    ]
    assert main([*argv, "--k", "3", "--format", "pt2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    config = repo.config("mlp_parity", "onnx_add_k3_r1_p0")
    assert config.model_format == "pt2"
    with repo.load("mlp_parity", "onnx_add_k3_r1_p0") as model:
        assert model.predict(np.zeros((2, examples.MLP_SIZES[0]), np.float32)).shape == (2, 3)
    np.savez(tmp_path / "wide.npz", x=np.zeros((50, 9), np.float32))
    bad = ["parity", "train", "mlp/onnx", "--data", str(tmp_path / "wide.npz"), "--root", root, "--k", "4"]
    assert main(bad) == 2
    assert "inputs of shape [50, 9]" in capsys.readouterr().err
    assert "onnx_add_k4_r1_p0" not in repo.variant_names("mlp_parity")
