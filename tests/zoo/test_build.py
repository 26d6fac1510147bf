"""Building the zoo: idempotent, resumable, deterministic; trained families get better with size."""

from __future__ import annotations

import numpy as np
import pytest

from failsoft.zoo import BuildEvent, build_zoo
from failsoft.zoo.build import is_built, make_variant, write_variant
from failsoft.zoo.catalog import family_spec
from failsoft.zoo.digits import load_digits_split
from failsoft.zoo.layout import WEIGHTS_FILE, read_config
from failsoft.zoo.profiler import QUICK


def test_a_second_build_skips_everything(tiny_zoo):
    events: list[BuildEvent] = []
    build_zoo(tiny_zoo.root, ["digits_mlp"], events.append, settings=QUICK, device="cpu")
    finished = [e for e in events if e.state != "start"]
    assert len(finished) == 8  # build + profile for 4 variants
    assert {e.state for e in finished} == {"skipped"}
    assert [e.index for e in finished] == [1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.slow  # rebuilds and profiles a variant: seconds of CPU
def test_a_broken_or_half_built_variant_is_rebuilt_and_reprofiled(zoo_copy):
    fam_dir = zoo_copy.root / "digits_mlp"
    weights = fam_dir / "mlp_s" / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    (fam_dir / ".build-mlp_m-999").mkdir()  # scratch left by an interrupted build
    (fam_dir / ".build-mlp_m-999" / WEIGHTS_FILE).write_bytes(b"half")
    old_profile = zoo_copy.profile("digits_mlp", "mlp_s")["profiled_at"]
    events: list[BuildEvent] = []
    build_zoo(zoo_copy.root, ["digits_mlp/mlp_s", "digits_mlp/mlp_m"], events.append, settings=QUICK)
    done = {(e.stage, e.variant) for e in events if e.state == "done"}
    assert done == {("build", "mlp_s"), ("profile", "mlp_s")}
    assert is_built(fam_dir / "mlp_s")
    assert zoo_copy.load("digits_mlp", "mlp_s", "cpu").predict(np.zeros((1, 64), np.float32)).shape == (1, 10)
    assert zoo_copy.profile("digits_mlp", "mlp_s")["profiled_at"] >= old_profile
    assert zoo_copy.variant_names("digits_mlp") == ["mlp_l", "mlp_m", "mlp_s", "mlp_xs"]


def test_training_is_deterministic(tmp_path, tiny_zoo):
    fam = family_spec("digits_mlp")
    config = write_variant(tmp_path / "again", fam, fam.variant("mlp_m"))
    assert config.weights_sha256 == tiny_zoo.config("digits_mlp", "mlp_m").weights_sha256


@pytest.mark.slow  # trains the largest MLP: seconds of CPU
def test_largest_trained_variant_beats_the_smallest(tiny_zoo):
    mlp = {v: tiny_zoo.config("digits_mlp", v) for v in tiny_zoo.variant_names("digits_mlp")}
    assert mlp["mlp_l"].accuracy.value > mlp["mlp_xs"].accuracy.value
    assert all(c.accuracy.source == "measured" and c.accuracy.detail["n_test"] == 360 for c in mlp.values())
    cnn = family_spec("digits_cnn")
    _, _, small = make_variant(cnn, cnn.variant("cnn_xs"))
    _, _, large = make_variant(cnn, cnn.variant("cnn_l"))
    assert large.value > small.value
    assert large.source == small.source == "measured"


def test_the_split_is_fixed_and_held_out():
    split = load_digits_split()
    assert (len(split.y_train), len(split.y_test)) == (1437, 360)
    assert split.x_test.dtype == np.float32 and split.x_test.min() >= 0 and split.x_test.max() <= 1
    train_rows = {row.tobytes() for row in split.x_train}
    assert sum(row.tobytes() in train_rows for row in split.x_test) < 5  # the digits set has a few duplicates
    assert load_digits_split() is split


def test_config_records_shapes_and_sizes(tiny_zoo):
    config = read_config(tiny_zoo.variant_dir("digits_mlp", "mlp_l"))
    assert config.input_shape == (64,) and config.num_classes == 10
    assert config.parameters == 64 * 1024 + 1024 + 2 * (1024 * 1024 + 1024) + 1024 * 10 + 10
    assert config.weights_bytes > 4 * config.parameters
