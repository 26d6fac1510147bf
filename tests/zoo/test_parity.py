"""Parity models: trained against the deployed model's summed outputs, measured, stored, refused when
they do not fit. The tests train with a larger learning rate and few epochs to stay fast; the
defaults (the public config's) are exercised by ``failsoft parity train`` in docs/parm.md."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from failsoft.errors import ConfigError, CorruptModelError, ModelNotFoundError
from failsoft.policies.registry import get_encoder
from failsoft.zoo.digits import load_digits_split
from failsoft.zoo.layout import CONFIG_FILE
from failsoft.zoo.parity import (
    ParityCode,
    ParityTraining,
    check_parity,
    measure_degraded,
    read_parity,
    train_parity,
)
from failsoft.zoo.profiler import QUICK

FAST = ParityTraining(epochs=40, lr=1e-2)


@pytest.mark.slow  # trains a parity model: seconds of CPU
def test_a_trained_parity_model_reconstructs_far_above_the_default_bound(small_zoo_copy):
    repo = small_zoo_copy
    code = ParityCode("digits_mlp", "mlp_s", k=2)
    result = train_parity(repo, code, FAST, profile=True, settings=QUICK, device="cpu")
    acc = result.accuracy
    assert acc.default == pytest.approx(0.1) and acc.decoded == 360
    assert acc.degraded > 6 * acc.default  # paper section 5: well above a random default
    assert acc.deployed == pytest.approx(repo.config("digits_mlp", "mlp_s").accuracy.value)
    # stored like any variant: config with a parity block, weights, a profile; loads and serves
    assert (code.parity_family, code.parity_variant) == ("digits_mlp_parity", "mlp_s_add_k2_r1_p0")
    config = repo.config(code.parity_family, code.parity_variant)
    assert (
        config.arch == "digits_mlp" and config.architecture == repo.config("digits_mlp", "mlp_s").architecture
    )
    assert config.accuracy.value == acc.degraded and config.accuracy.detail["deployed"] == acc.deployed
    (family,) = repo.families(["digits_mlp_parity"])
    assert family.variants[0].accuracy == acc.degraded and family.variants[0].latency_ms > 0
    info = read_parity(repo, code.parity_family, code.parity_variant)
    assert info.code == code and info.deployed_sha256 == repo.config("digits_mlp", "mlp_s").weights_sha256
    with repo.load(code.parity_family, code.parity_variant, device="cpu") as model:
        assert model.predict(np.zeros((3, 64), np.float32)).shape == (3, 10)


def test_training_is_deterministic(small_zoo_copy):
    code = ParityCode("digits_mlp", "mlp_s", k=3)
    short = ParityTraining(epochs=2, lr=1e-2)
    first = train_parity(small_zoo_copy, code, short, profile=False)
    again = train_parity(small_zoo_copy, code, short, profile=False)
    assert first.weights_sha256 == again.weights_sha256
    other = train_parity(small_zoo_copy, code, ParityTraining(epochs=2, lr=1e-2, seed=1), profile=False)
    assert other.weights_sha256 != first.weights_sha256


def test_concat_and_a_second_parity_model_are_trained_for_their_own_code(small_zoo_copy):
    concat = train_parity(
        small_zoo_copy, ParityCode("digits_mlp", "mlp_s", 2, 1, "concat"), FAST, profile=False
    )
    second = train_parity(
        small_zoo_copy, ParityCode("digits_mlp", "mlp_s", 2, 2, "add", 1), FAST, profile=False
    )
    for result in (concat, second):
        assert result.accuracy.degraded > 4 * result.accuracy.default
    stored = json.loads(
        (small_zoo_copy.variant_dir("digits_mlp_parity", "mlp_s_add_k2_r2_p1") / CONFIG_FILE).read_text()
    )
    assert stored["parity"]["coefficients"] == [1.0, 2.0] and stored["parity"]["index"] == 1


def test_degraded_accuracy_of_an_exact_parity_model_equals_the_deployed_accuracy():
    """With a linear deployed model, F itself is an exact parity model: decoding loses nothing."""
    split = load_digits_split()
    linear = torch.nn.Linear(64, 10, bias=False)
    with torch.no_grad():
        linear.weight.copy_(
            torch.from_numpy(np.random.default_rng(0).normal(size=(10, 64)).astype(np.float32))
        )
        logits = linear(torch.from_numpy(np.array(split.x_test))).numpy()
    for k in (2, 3, 4):
        code = ParityCode("digits_mlp", "linear", k)
        got = measure_degraded(code, get_encoder("add", k), linear, logits, split)
        assert got.reconstruction == pytest.approx(1.0)
        assert got.degraded == pytest.approx(got.deployed) and got.decoded == 360


def test_a_parity_model_for_another_variant_k_or_weights_is_refused(small_zoo_copy):
    repo = small_zoo_copy
    code = ParityCode("digits_mlp", "mlp_s", k=2)
    train_parity(repo, code, ParityTraining(epochs=1), profile=False)
    name = ("digits_mlp_parity", "mlp_s_add_k2_r1_p0")
    assert check_parity(repo, *name, code).code == code
    with pytest.raises(ConfigError, match=r"k=2, .*this group needs .*k=3.*\(k differs\)"):
        check_parity(repo, *name, ParityCode("digits_mlp", "mlp_s", k=3))
    with pytest.raises(ConfigError, match=r"encoder differs"):
        check_parity(repo, *name, ParityCode("digits_mlp", "mlp_s", 2, 1, "concat"))
    with pytest.raises(ConfigError, match="is not a parity model"):
        check_parity(repo, "digits_mlp", "mlp_s", code)
    deployed = repo.variant_dir("digits_mlp", "mlp_s") / CONFIG_FILE
    data = json.loads(deployed.read_text())
    data["weights"]["sha256"] = "0" * 64  # the deployed variant was rebuilt with other weights
    deployed.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="train it again"):
        check_parity(repo, *name, code)
    parity_config = repo.variant_dir(*name) / CONFIG_FILE
    data = json.loads(parity_config.read_text())
    data["parity"]["k"] = 9
    parity_config.write_text(json.dumps(data))
    with pytest.raises(CorruptModelError, match="invalid parity block"):
        read_parity(repo, *name)


def test_bad_requests_are_refused_naming_the_value(small_zoo_copy):
    with pytest.raises(ConfigError, match=r"parity index must be in 0..1; got 2"):
        ParityCode("digits_mlp", "mlp_s", 2, 2, "add", 2)
    with pytest.raises(ConfigError, match=r"k must be an integer in 2..4; got 5"):
        ParityCode("digits_mlp", "mlp_s", 5)
    with pytest.raises(ModelNotFoundError, match="mlp_q"):
        train_parity(small_zoo_copy, ParityCode("digits_mlp", "mlp_q", 2), profile=False)
    with pytest.raises(ConfigError, match="epochs=0"):
        ParityTraining(epochs=0)
    train_parity(
        small_zoo_copy, ParityCode("digits_mlp", "mlp_s", 2), ParityTraining(epochs=1), profile=False
    )
    with pytest.raises(ConfigError, match="itself a parity model"):
        train_parity(small_zoo_copy, ParityCode("digits_mlp_parity", "mlp_s_add_k2_r1_p0", 2), profile=False)
