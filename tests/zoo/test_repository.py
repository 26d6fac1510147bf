"""The repository on disk: round trips, clear errors for broken files, names that cannot escape."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from failsoft.errors import ConfigError, CorruptModelError, ModelNotFoundError
from failsoft.zoo import ModelRepository, default_zoo_path
from failsoft.zoo.build import make_variant, store_variant
from failsoft.zoo.catalog import family_spec
from failsoft.zoo.layout import CONFIG_FILE, PROFILE_FILE, WEIGHTS_FILE


def _store(root: Path, family: str, variant: str):
    fam = family_spec(family)
    var = fam.variant(variant)
    module, architecture, accuracy = make_variant(fam, var)
    config = store_variant(root / family / variant, fam, var, module, architecture, accuracy)
    return module, config


@pytest.mark.parametrize(
    ("family", "variant"),
    [("digits_mlp", "mlp_s"), ("digits_cnn", "cnn_s"), ("regnet", "regnet_y_400mf")],
)
def test_stored_variant_loads_back_to_identical_outputs(tmp_path, family, variant):
    module, config = _store(tmp_path, family, variant)
    x = np.random.default_rng(0).random((3, *config.input_shape), dtype=np.float32)
    with torch.inference_mode():
        out = module(torch.from_numpy(x))
        expected = (out.logits if hasattr(out, "logits") else out).numpy()
    with ModelRepository(tmp_path).load(family, variant, device="cpu") as loaded:
        assert loaded.input_shape == config.input_shape
        assert loaded.device == "cpu"
        got = loaded.predict(x)
        stored = {k: v.detach() for k, v in loaded._module.state_dict().items()}
    original = module.state_dict()
    assert stored.keys() == original.keys()
    for name, tensor in original.items():  # the weights come back bit for bit
        assert torch.equal(stored[name], tensor), name
    assert got.dtype == np.float32
    assert got.shape == (3, config.num_classes)
    # The same weights give the same outputs up to the kernel oneDNN picks for the tensors' memory
    # layout (a grouped conv of RegNet differed in the last bit once, with identical weights).
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_loaded_model_refuses_bad_batches_and_use_after_close(tiny_zoo):
    model = tiny_zoo.load("digits_mlp", "mlp_xs", device="cpu")
    assert model.predict(np.zeros((2, 64), np.float32)).shape == (2, 10)
    with pytest.raises(ConfigError, match=r"shape \(N, 64\)"):
        model.predict(np.zeros((2, 63), np.float32))
    with pytest.raises(ConfigError, match="shape"):
        model.predict(np.zeros(64, np.float32))
    with pytest.raises(ConfigError, match="dtype"):
        model.predict(np.array([["a"] * 64]))
    model.close()
    model.close()
    with pytest.raises(ConfigError, match="closed"):
        model.predict(np.zeros((1, 64), np.float32))


def test_families_come_from_profiles(tiny_zoo):
    (fam,) = tiny_zoo.families()
    assert fam.name == "digits_mlp"
    assert [v.name for v in fam.variants] == ["mlp_xs", "mlp_s", "mlp_m", "mlp_l"]
    for v in fam.variants:
        profile = tiny_zoo.profile("digits_mlp", v.name)
        assert v.memory_mb == profile["memory_mb"] and v.load_ms == profile["load_ms"]
        assert v.latency_ms == pytest.approx(profile["latency"]["1"]["p50_ms"], abs=1e-4)
        assert v.accuracy_source == "measured" and 0.5 < v.accuracy <= 1
    assert tiny_zoo.family_names() == ["digits_mlp"]


def test_unprofiled_variants_are_left_out_of_families(zoo_copy):
    (zoo_copy.variant_dir("digits_mlp", "mlp_m") / PROFILE_FILE).unlink()
    (fam,) = zoo_copy.families()
    assert "mlp_m" not in [v.name for v in fam.variants]
    with pytest.raises(ModelNotFoundError, match=r"profile\.json"):
        zoo_copy.profile("digits_mlp", "mlp_m")


def test_unknown_names_are_model_not_found(tiny_zoo):
    with pytest.raises(ModelNotFoundError, match="no variant digits_mlp/mlp_xxl"):
        tiny_zoo.load("digits_mlp", "mlp_xxl")
    with pytest.raises(ModelNotFoundError):
        tiny_zoo.variant_dir("nope", "mlp_s")


@pytest.mark.parametrize("name", ["../x", "..", ".", "/etc", "a/b", "a\\b", "", ".hidden", "x\x00y", 3])
def test_names_that_could_escape_are_refused(tiny_zoo, name):
    with pytest.raises(ModelNotFoundError):
        tiny_zoo.load(name, "mlp_s")
    with pytest.raises(ModelNotFoundError):
        tiny_zoo.variant_dir("digits_mlp", name)


def test_symlinks_out_of_the_repository_are_refused(zoo_copy, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    real = zoo_copy.variant_dir("digits_mlp", "mlp_s")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (outside / name).write_bytes((real / name).read_bytes())
    os.symlink(outside, zoo_copy.root / "digits_mlp" / "evil")
    os.symlink(tmp_path, zoo_copy.root / "evilfam")
    with pytest.raises(ModelNotFoundError, match="outside"):
        zoo_copy.load("digits_mlp", "evil")
    with pytest.raises(ModelNotFoundError, match="outside"):
        zoo_copy.variant_names("evilfam")
    assert "evil" not in zoo_copy.variant_names("digits_mlp")
    assert zoo_copy.family_names() == ["digits_mlp"]


def test_missing_weight_file_is_model_not_found(zoo_copy):
    path = zoo_copy.variant_dir("digits_mlp", "mlp_s") / WEIGHTS_FILE
    path.unlink()
    with pytest.raises(ModelNotFoundError, match=r"model\.safetensors"):
        zoo_copy.load("digits_mlp", "mlp_s")


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: b"\x00" * len(data),  # zeroed header
        lambda data: b"not a safetensors file",
        lambda data: b"",
    ],
    ids=["truncated", "zeroed", "garbage", "empty"],
)
def test_corrupt_weight_file_is_a_clear_error(zoo_copy, damage):
    path = zoo_copy.variant_dir("digits_mlp", "mlp_l") / WEIGHTS_FILE
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptModelError, match=r"mlp_l/model\.safetensors"):
        zoo_copy.load("digits_mlp", "mlp_l")


def test_weights_that_do_not_fit_the_config_are_corrupt(zoo_copy):
    small = zoo_copy.variant_dir("digits_mlp", "mlp_s") / WEIGHTS_FILE
    large = zoo_copy.variant_dir("digits_mlp", "mlp_l") / WEIGHTS_FILE
    large.write_bytes(small.read_bytes())
    with pytest.raises(CorruptModelError, match=r"does not fit its config\.json"):
        zoo_copy.load("digits_mlp", "mlp_l")


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "not valid JSON"), ("[]", "JSON object"), ('{"format": 1}', "family")],
)
def test_corrupt_config_is_a_clear_error(zoo_copy, text, message):
    (zoo_copy.variant_dir("digits_mlp", "mlp_s") / CONFIG_FILE).write_text(text)
    with pytest.raises(CorruptModelError, match=message):
        zoo_copy.load("digits_mlp", "mlp_s")


def test_corrupt_profile_is_a_clear_error(zoo_copy):
    path = zoo_copy.variant_dir("digits_mlp", "mlp_s") / PROFILE_FILE
    profile = json.loads(path.read_text())
    path.write_text(json.dumps(profile | {"memory_mb": -1}))
    with pytest.raises(CorruptModelError, match="memory_mb"):
        zoo_copy.families()


def test_bad_device_is_a_config_error(tiny_zoo):
    with pytest.raises(ConfigError, match="device"):
        tiny_zoo.load("digits_mlp", "mlp_s", device="tpu:banana")


def test_default_zoo_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FAILSOFT_ZOO", str(tmp_path / "z"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_zoo_path() == tmp_path / "z"
    monkeypatch.delenv("FAILSOFT_ZOO")
    assert default_zoo_path() == tmp_path / "cache" / "failsoft" / "zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_zoo_path() == tmp_path / ".cache" / "failsoft" / "zoo"


def test_an_empty_or_absent_repository_lists_nothing(tmp_path):
    assert ModelRepository(tmp_path / "absent").family_names() == []
    assert ModelRepository(tmp_path).families() == ()


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_weights_on_the_cpu_are_the_files_mapped_pages_not_a_copy(tiny_zoo):
    from failsoft.zoo.network import read_weights, weights_path

    path = weights_path(tiny_zoo.variant_dir("digits_mlp", "mlp_l")).resolve()
    state = read_weights(path, "cpu")
    regions = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            lo, hi = line.split()[0].split("-")
            regions.append((int(lo, 16), int(hi, 16)))
    assert regions, "the weight file is not mapped"
    for name, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        assert any(lo <= ptr < hi for lo, hi in regions), f"{name} was copied out of the file"
    # the mapped, assigned weights answer bit for bit as a module that copied them in the usual way
    from safetensors.torch import load_file

    from failsoft.zoo.layout import read_config
    from failsoft.zoo.network import build_network

    loaded = tiny_zoo.load("digits_mlp", "mlp_l", "cpu")
    copied, _ = build_network(read_config(path.parent))
    copied.load_state_dict(load_file(str(path)))  # copies into the module's own tensors
    batch = loaded.example_batch(8)
    with torch.inference_mode():
        expected = copied.eval()(torch.from_numpy(batch)).numpy()
    assert np.array_equal(loaded.predict(batch), expected)


def test_bench_load_times_each_phase_with_the_loaders_functions(tiny_zoo):
    from failsoft.bench.load import PHASES, LoadBenchSettings, run

    result = run(tiny_zoo, LoadBenchSettings(("digits_mlp/mlp_l",), repeats=2))
    row = result["variants"]["digits_mlp/mlp_l"]
    assert all(row[p] >= 0 for p in PHASES) and row["load_ms"] > 0
    assert row["weight_bytes"] == (tiny_zoo.variant_dir("digits_mlp", "mlp_l") / WEIGHTS_FILE).stat().st_size
    assert row["limit_ms"] == pytest.approx(row["copy_ms"] + row["answer_ms"], abs=0.02)
    assert row["ratio"] == pytest.approx(row["load_ms"] / row["limit_ms"], rel=0.02)
    # the recovery load to its route, before and after: the skeleton taken (built ahead, apart) and
    # the warm-up cut to the first answer (the rest after the route, apart)
    route = row["to_route"]
    before, after = route["cpu_ms"]["before"], route["cpu_ms"]["after"]
    assert route["warmup_sizes"][0] == 1 and len(route["warmup_sizes"]) > 1
    assert after["total"] == pytest.approx(
        after["read"] + after["skeleton"] + after["assign"] + after["first_answer"], abs=0.05
    )
    assert after["warm_up_after_route"] > 0 and after["skeleton_ahead"] > 0
    assert before["warm_up"] > after["first_answer"]  # every warm-up size against one answer
    assert route["ratio"] == pytest.approx(after["total"] / before["total"], abs=0.01)
    assert route["skeleton_kib"] > 0
    with pytest.raises(ConfigError, match="family/variant"):
        LoadBenchSettings(("mlp_l",))
