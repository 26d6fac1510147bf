"""Each model format through the handler contract: real artefacts (random weights, fixed seeds) written
by the libraries users write them with, loaded by the library made for each, answers compared with
the model in memory."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.zoo.formats import examples
from failsoft.zoo.formats.interface import Signature, TensorSpec
from failsoft.zoo.formats.registry import open_handler

X = np.random.default_rng(3).random((5, examples.MLP_SIZES[0]), dtype=np.float32)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return examples.mlp_artefacts(tmp_path_factory.mktemp("mlp"))


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    import torch

    module = examples.mlp_module(examples.mlp_weights())
    with torch.no_grad():
        return module(torch.from_numpy(X)).numpy()


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("onnx", {}), ("pt2", {}), ("python", {"class": "failsoft.zoo.formats.examples:MlpHandler"})],
)
def test_one_model_answers_the_same_in_every_format(mlp, reference, fmt, options):
    handler = open_handler(fmt, mlp[fmt], options)
    signature = handler.load("cpu")
    assert signature.inputs[0].datatype == "FP32" and signature.inputs[0].shape == (8,)
    assert signature.outputs[0].shape == (3,)
    name = signature.inputs[0].name
    out = handler.infer({name: X})[signature.outputs[0].name]
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
    one = handler.infer({name: X[:1]})[signature.outputs[0].name]  # the batch dimension is variable
    np.testing.assert_allclose(one, reference[:1], rtol=1e-5, atol=1e-5)
    assert handler.parameters() == 8 * 16 + 16 + 16 * 3 + 3
    handler.close()


def test_onnx_sessions_run_the_threads_they_are_given(mlp):
    handler = open_handler("onnx", mlp["onnx"], {})
    handler.load("cpu")
    options = handler._session.get_session_options()  # type: ignore[attr-defined]
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    two = open_handler("onnx", mlp["onnx"], {"threads": 2})
    two.load("cpu")
    assert two._session.get_session_options().intra_op_num_threads == 2  # type: ignore[attr-defined]


def test_a_corrupt_onnx_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x08\x07not a protobuf" * 4)
    with pytest.raises(CorruptModelError, match=r"model\.onnx.*does not load"):
        open_handler("onnx", bad, {}).load("cpu")


def test_a_user_handler_that_does_not_import_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"'nowhere\.mod:Cls' does not import: ModuleNotFoundError"):
        open_handler("python", tmp_path / "w.safetensors", {"class": "nowhere.mod:Cls"})
    with pytest.raises(ConfigError, match="not a subclass of failsoft's Handler"):
        not_a_handler = {"class": "failsoft.zoo.formats.examples:mlp_module"}
        open_handler("python", tmp_path / "w.safetensors", not_a_handler)
    with pytest.raises(ConfigError, match=r"package\.module:Class"):
        open_handler("python", tmp_path / "w.safetensors", {"class": "no_colon"})


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return examples.image_classifier(tmp_path_factory.mktemp("hf-image") / "model")


def test_hf_image_classifier_takes_pixels_or_png_bytes(image_dir):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageClassification

    handler = open_handler("hf", image_dir, {})
    signature = handler.load("cpu")
    assert signature == Signature(
        (TensorSpec("pixel_values", "FP32", (3, 32, 32)),),
        (TensorSpec("logits", "FP32", (3,)),),
        examples.IMAGE_LABELS,
    )
    pixels = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    model = AutoModelForImageClassification.from_pretrained(image_dir, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    np.testing.assert_allclose(handler.infer({"pixel_values": pixels})["logits"], expected, atol=1e-5)
    png = io.BytesIO()
    Image.fromarray(np.full((40, 50, 3), 200, dtype=np.uint8)).save(png, format="PNG")
    out = handler.infer({"image": np.array([png.getvalue()], dtype=object)})["logits"]
    assert out.shape == (1, 3) and np.isfinite(out).all()


def test_hf_text_classifier_tokenizes_bytes(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    directory = examples.text_classifier(tmp_path / "text")
    handler = open_handler("hf", directory, {})
    signature = handler.load("cpu")
    assert signature.inputs == (TensorSpec("text", "BYTES", (1,)),)
    assert signature.labels == ("negative", "positive")
    texts = ["a good film", "a dull story"]
    out = handler.infer({"text": np.array([[t.encode()] for t in texts], dtype=object)})["logits"]
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(out, expected, atol=1e-5)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CorruptModelError, match="has no tokenizer"):
        open_handler("hf", directory, {}).load("cpu")


def test_hf_directory_with_only_a_pickle_checkpoint_is_refused(image_dir, tmp_path):
    import shutil

    pickled = tmp_path / "pickled"
    shutil.copytree(image_dir, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(CorruptModelError, match=r"only a pickle checkpoint \(pytorch_model.bin\)"):
        open_handler("hf", pickled, {}).load("cpu")
    with pytest.raises(ConfigError, match="unknown task"):
        open_handler("hf", image_dir, {"task": "translation"}).load("cpu")


def test_signature_mismatch_names_the_difference():
    a = Signature((TensorSpec("x", "FP32", (8,)),), (TensorSpec("logits", "FP32", (3,)),))
    b = Signature((TensorSpec("input", "FP32", (8,)),), (TensorSpec("out", "FP32", (4,)),))
    assert a.mismatch(a) is None
    assert a.mismatch(Signature(b.inputs, a.outputs)) is None  # names may differ
    assert a.mismatch(b) == "output out FP32[4] where the family has logits FP32[3]"
    with pytest.raises(ValueError, match="positive or -1"):
        TensorSpec("x", "FP32", (0,))
