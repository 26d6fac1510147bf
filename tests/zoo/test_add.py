"""``failsoft zoo add``: a user's model checked, written, profiled and then treated like a built one;
every refusal one line, exit 2, and the repository left byte for byte as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from failsoft.cli import main
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.profiler import ProfileSettings

# one load, one batch size: the profiler's path is exercised, its statistics are not under test
FAST = ProfileSettings(
    loads=1, warm_loads=0, batch_sizes=(1,), warmup_iters=0, min_iters=1, max_iters=1, budget_s=0.0
)
MLP_HANDLER = "failsoft.zoo.formats.examples:MlpHandler"


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    out = tmp_path_factory.mktemp("artefacts")
    paths = examples.mlp_artefacts(out)
    x = np.random.default_rng(5).random((20, 8), dtype=np.float32)
    with torch.no_grad():
        y = examples.mlp_module(examples.mlp_weights())(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(out / "eval.npz", x=x, y=y)  # labelled with the model's own answers: accuracy 1.0
    np.save(out / "sample.npy", x[:3])
    return paths | {"eval": out / "eval.npz", "sample": out / "sample.npy", "root": out}


@pytest.fixture(scope="module")
def base_repo(artefacts, tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """A repository holding the MLP as mlp/onnx, added and profiled once (tests copy it)."""
    repo = ModelRepository(tmp_path_factory.mktemp("base") / "zoo")
    request = AddRequest("mlp", "onnx", artefacts["onnx"], accuracy=0.9, sample_file=artefacts["sample"])
    add_variant(repo, request, FAST)
    return repo


@pytest.fixture
def repo(base_repo, tmp_path) -> ModelRepository:
    shutil.copytree(base_repo.root, tmp_path / "zoo")
    return ModelRepository(tmp_path / "zoo")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_add_measures_accuracy_profiles_and_lists_the_variant(capsys, repo, artefacts):
    code, out, err = run(
        capsys, "zoo", "add", "mlp/pt2", str(artefacts["pt2"]), "--eval", str(artefacts["eval"]),
        "--sample", str(artefacts["sample"]), "--out", str(repo.root), "--quick",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("added mlp/pt2 (pt2, 195 parameters, accuracy 1.000 measured)")
    config = json.loads((repo.root / "mlp" / "pt2" / "config.json").read_text())
    assert config["model_format"] == "pt2" and config["weights"]["file"] == "model.pt2"
    assert config["accuracy"]["source"] == "measured" and config["accuracy"]["detail"]["examples"] == 20
    assert config["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [8]}]
    assert config["input_shape"] == [8] and config["num_classes"] == 3
    profile = repo.profile("mlp", "pt2")
    assert set(profile["latency"]) == {"1", "4", "16"} and profile["memory_mb"] > 0
    code, out, _ = run(capsys, "zoo", "list", str(repo.root), "--json")
    rows = {r["variant"]: r for r in json.loads(out)["variants"]}
    assert rows["pt2"]["accuracy_source"] == "measured" and rows["onnx"]["accuracy_source"] == "declared"
    code, out, _ = run(capsys, "zoo", "scenario", str(repo.root))
    assert {v["variant"] for v in json.loads(out)["families"]["mlp"]} == {"onnx", "pt2"}
    x = np.load(artefacts["sample"])
    with repo.load("mlp", "onnx", "cpu") as a, repo.load("mlp", "pt2", "cpu") as b:
        np.testing.assert_allclose(a.predict(x), b.predict(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(a.example_batch(4), np.concatenate([x, x[:1]]))  # the user's sample


def test_a_python_handler_joins_the_family(repo, artefacts):
    request = AddRequest(
        "mlp",
        "python",
        artefacts["python"],
        accuracy=0.9,
        sample_file=artefacts["sample"],
        handler=MLP_HANDLER,
    )
    config = add_variant(repo, request, FAST)
    assert config.model_format == "python" and config.handler == {"class": MLP_HANDLER}
    x = np.load(artefacts["sample"])
    with repo.load("mlp", "onnx", "cpu") as a, repo.load("mlp", "python", "cpu") as b:
        np.testing.assert_allclose(a.predict(x), b.predict(x), rtol=1e-5, atol=1e-5)


def test_a_text_classifier_is_added_with_its_tokenizer_and_measured_on_jsonl(tmp_path):
    directory = examples.text_classifier(tmp_path / "text")
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "positive"}) + "\n" for t in examples.TEXTS))
    repo = ModelRepository(tmp_path / "zoo")
    config = add_variant(
        repo, AddRequest("sentiment", "bert", directory, eval_file=data, sample_file=data), FAST
    )
    assert config.inputs[0].datatype == "BYTES" and config.num_classes == 2
    assert config.accuracy.source == "measured" and config.accuracy.detail["examples"] == 4
    with repo.load("sentiment", "bert", "cpu") as model:
        out = model.predict(np.array([[b"a good film"]], dtype=object))
    assert out.shape == (1, 2)
    assert repo.is_profiled("sentiment", "bert")


def _mismatched_onnx(path: Path) -> Path:
    """An 8-input, 4-class linear model written with onnx's helpers: it cannot join a 3-class family."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], [w],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _refusal_cases(tmp: Path, artefacts: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    tmp.mkdir()
    corrupt = tmp / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07 not an onnx file" * 8)
    pickle_file = tmp / "pytorch_model.bin"
    pickle_file.write_bytes(b"\x80\x04pickle")
    image = examples.image_classifier(tmp / "image")
    pickle_dir = tmp / "pickled"
    shutil.copytree(image, pickle_dir)
    (pickle_dir / "model.safetensors").rename(pickle_dir / "pytorch_model.bin")
    no_tokenizer = examples.text_classifier(tmp / "text")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    two_labels = tmp / "labels.txt"
    two_labels.write_text("a\nb\n")
    acc = ["--accuracy", "0.5"]
    return {
        "corrupt onnx": ([str(corrupt), *acc], "is not an ONNX model"),
        "pickle file": ([str(pickle_file), *acc], "is a pickle checkpoint"),
        "pickle-only dir": ([str(pickle_dir), *acc], "only a pickle checkpoint (pytorch_model.bin)"),
        "no tokenizer": ([str(no_tokenizer), *acc], "has no tokenizer"),
        "handler": ([str(artefacts["python"]), "--handler", "nowhere.mod:Cls", *acc], "does not import"),
        "outputs": (
            [str(_mismatched_onnx(tmp / "four.onnx")), *acc],
            "output logits FP32[4] where the family",
        ),
        "inputs": ([str(image), *acc], "input pixel_values FP32[3, 32, 32] where the family has x FP32[8]"),
        "accuracy": ([str(artefacts["pt2"])], "--accuracy A (declared) or --eval FILE (measured)"),
        "exists": ([str(artefacts["onnx"]), *acc], "already in"),
        "labels": (
            [str(artefacts["pt2"]), "--labels", str(two_labels), *acc],
            "names 2 classes; the model has 3",
        ),
    }


def test_refusals_are_one_line_and_leave_the_repository_unchanged(capsys, repo, artefacts, tmp_path):
    before = snapshot(repo.root)
    cases = _refusal_cases(tmp_path / "bad", artefacts)
    capsys.readouterr()  # what building the bad artefacts printed
    for case, (args, message) in cases.items():
        variant = "onnx" if case == "exists" else "new"
        code, out, err = run(capsys, "zoo", "add", f"mlp/{variant}", *args, "--out", str(repo.root))
        assert code == 2, (case, out, err)
        assert message in err, (case, err)
        assert len(err.strip().splitlines()) == 1, (case, err)
        assert snapshot(repo.root) == before, case
