"""Random-weight parity models for latency work (paper 6.1): ResNet-18 deployed, its parity model the
same architecture with random weights, stored, checked and served like a trained one."""

from __future__ import annotations

import numpy as np
import pytest

from failsoft.errors import ConfigError
from failsoft.zoo import ModelRepository
from failsoft.zoo.parity import ParityCode, check_parity, random_parity, read_parity


@pytest.fixture(scope="module")
def resnet_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    from failsoft.zoo.build import build_zoo

    return build_zoo(tmp_path_factory.mktemp("resnet-zoo"), ["resnet/resnet18"], profile=False)


def test_a_resnet18_parity_model_has_the_deployed_architecture_and_random_weights(resnet_zoo):
    code = ParityCode("resnet", "resnet18", k=2)
    out = random_parity(resnet_zoo, code, seed=0, profile=False)
    assert out["variant"] == "resnet18_add_k2_r1_p0" and out["random_weights"] is True
    deployed = resnet_zoo.config("resnet", "resnet18")
    config = resnet_zoo.config("resnet_parity", "resnet18_add_k2_r1_p0")
    assert config.architecture == deployed.architecture and config.parameters == deployed.parameters
    assert config.weights_sha256 != deployed.weights_sha256  # its own weights, not a copy
    assert config.accuracy.value == pytest.approx(1 / 1000) and config.accuracy.detail["random_weights"]
    info = check_parity(resnet_zoo, "resnet_parity", "resnet18_add_k2_r1_p0", code)
    assert info.code == code
    encoder_query = np.zeros((1, *deployed.input_shape), np.float32)
    with resnet_zoo.load("resnet_parity", "resnet18_add_k2_r1_p0", device="cpu") as model:
        assert model.predict(encoder_query).shape == (1, 1000)
    again = random_parity(resnet_zoo, code, seed=0, profile=False)
    assert again["parameters"] == out["parameters"]
    assert resnet_zoo.config("resnet_parity", "resnet18_add_k2_r1_p0").weights_sha256 == config.weights_sha256
    other = ParityCode("resnet", "resnet18", k=3)
    with pytest.raises(ConfigError, match="k=3"):  # stored for k=2: refused for another code
        check_parity(resnet_zoo, "resnet_parity", "resnet18_add_k2_r1_p0", other)
    assert read_parity(resnet_zoo, "resnet_parity", "resnet18_add_k2_r1_p0").code.k == 2


def test_a_parity_model_of_a_parity_model_is_refused(resnet_zoo):
    random_parity(resnet_zoo, ParityCode("resnet", "resnet18", k=2), profile=False)
    with pytest.raises(ConfigError, match="itself a parity model"):
        random_parity(resnet_zoo, ParityCode("resnet_parity", "resnet18_add_k2_r1_p0", k=2), profile=False)
