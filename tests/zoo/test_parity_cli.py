"""``failsoft parity train``: JSON out, one-line errors with exit code 2 before any training."""

from __future__ import annotations

import json

import pytest

from failsoft.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # trains parity models: seconds of CPU
def test_train_prints_each_parity_model_with_its_accuracies(capsys, small_zoo_copy):
    root = str(small_zoo_copy.root)
    args = ("parity", "train", "digits_mlp/mlp_s", "--k", "2", "--r", "2", "--root", root)
    code, out, err = run(capsys, *args, "--epochs", "30", "--lr", "0.01", "--no-profile")
    assert code == 0, err
    models = json.loads(out)["parity_models"]
    assert [m["variant"] for m in models] == ["mlp_s_add_k2_r2_p0", "mlp_s_add_k2_r2_p1"]
    for m in models:
        assert m["degraded_accuracy"] > 3 * m["default_accuracy"]
        assert m["deployed_accuracy"] > m["default_accuracy"] and m["epochs"] == 30
    assert small_zoo_copy.variant_names("digits_mlp_parity") == [m["variant"] for m in models]
    joint = json.loads(out)["joint"]  # both data members lost, decoded from the two parity models
    assert joint["missing"] == 2 and joint["decoded"] == 360
    assert joint["degraded_accuracy"] > 2 * models[0]["default_accuracy"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--encoder", "xor"), "unknown coding encoder 'xor'"),
        (("--k", "5"), "k must be an integer in 2..4; got 5"),
        (("--encoder", "concat", "--k", "3"), "k of 2 or 4"),
        (("--r", "0"), "r must be an integer in 1..4; got 0"),
    ],
)
def test_bad_codes_are_refused_in_one_line(capsys, small_zoo_copy, argv, message):
    code, _, err = run(
        capsys, "parity", "train", "digits_mlp/mlp_s", "--root", str(small_zoo_copy.root), *argv
    )
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert small_zoo_copy.variant_names("digits_mlp_parity") == []


def test_unknown_or_malformed_variants_are_refused(capsys, small_zoo_copy):
    root = str(small_zoo_copy.root)
    code, _, err = run(capsys, "parity", "train", "digits_mlp/mlp_q", "--root", root)
    assert code == 2 and "no variant digits_mlp/mlp_q" in err
    code, _, err = run(capsys, "parity", "train", "digits_mlp", "--root", root)
    assert code == 2 and "expected FAMILY/VARIANT" in err
