"""A model of two inputs and two outputs: added with ``zoo add`` in two formats (ONNX and
``torch.export``, whose outputs are named differently), loaded from the repository and served as one
structured batch; the protocol takes its inputs by name, refuses a missing, extra or mistyped one
naming it, and answers the outputs asked for (no Ray here; tests/runtime/test_byom_failover.py
serves the same family over HTTP)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.runtime.gateway.protocol import (
    ModelMeta,
    binary_infer_response,
    infer_response,
    model_metadata,
    parse_infer_request,
)
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.formats.interface import records
from failsoft.zoo.profiler import QUICK

INPUTS = examples.token_inputs(3, seed=5)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRepository, dict]:
    out = tmp_path_factory.mktemp("tokens")
    paths = examples.token_artefacts(out)
    repo = ModelRepository(out / "zoo")
    for fmt in ("onnx", "pt2"):
        add_variant(
            repo, AddRequest("tok", fmt, paths[fmt], accuracy=0.5, sample_file=paths["sample"]), QUICK
        )
    import torch

    with torch.no_grad():
        logits, pooled = examples.token_module()(*(torch.from_numpy(INPUTS[k]) for k in INPUTS))
    return repo, {"logits": logits.numpy(), "pooled": pooled.numpy()}


def meta_of(repo: ModelRepository) -> ModelMeta:
    config = repo.config("tok", "onnx")
    return ModelMeta((), 3, inputs=config.inputs, outputs=config.outputs)


def request(inputs: list[dict], outputs: list[dict] | None = None) -> bytes:
    body: dict = {"inputs": inputs}
    if outputs is not None:
        body["outputs"] = outputs
    return json.dumps(body).encode()


def tensor(name: str, values: np.ndarray, datatype: str = "INT64") -> dict:
    return {"name": name, "shape": list(values.shape), "datatype": datatype, "data": values.ravel().tolist()}


def test_both_formats_are_added_with_every_tensor_and_answer_a_structured_batch_alike(tokens):
    repo, expected = tokens
    config = repo.config("tok", "pt2")
    assert [t.describe() for t in config.inputs] == ["input_ids INT64[8]", "attention_mask INT64[8]"]
    assert [t.datatype for t in config.outputs] == ["FP32", "FP32"] and config.num_classes == 3
    assert config.input_shape == ()
    batch = records(INPUTS, repo.config("tok", "onnx").inputs)
    for variant in ("onnx", "pt2"):
        with repo.load("tok", variant) as model:
            answer = model.predict(batch)
            assert len(answer.dtype.names) == 2 and len(answer) == 3
            first, second = answer.dtype.names
            np.testing.assert_allclose(answer[first], expected["logits"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(answer[second], expected["pooled"], rtol=1e-5, atol=1e-5)
            warm = model.predict(np.zeros((2,), dtype=np.float32))  # the agents' zero-data warm-up
            assert len(warm) == 2
    assert repo.profile("tok", "onnx")["latency_ms"] > 0


def test_a_request_names_each_input_and_the_answer_each_output_asked_for(tokens):
    repo, expected = tokens
    meta = meta_of(repo)
    body = request(
        [tensor("attention_mask", INPUTS["attention_mask"]), tensor("input_ids", INPUTS["input_ids"])]
    )
    parsed = parse_infer_request(body, "tok-app", meta, 8)
    np.testing.assert_array_equal(parsed.batch["input_ids"], INPUTS["input_ids"])
    np.testing.assert_array_equal(parsed.batch["attention_mask"], INPUTS["attention_mask"])
    with repo.load("tok", "pt2") as model:
        answer = model.predict(parsed.batch)
    whole = infer_response("tok-app", answer, parsed, {})
    assert [o["name"] for o in whole["outputs"]] == ["logits", "pooled"]
    np.testing.assert_allclose(np.reshape(whole["outputs"][1]["data"], (3, 4)), expected["pooled"], atol=1e-5)
    asked = parse_infer_request(
        request(
            [
                tensor("input_ids", INPUTS["input_ids"]),
                tensor("attention_mask", INPUTS["attention_mask"], "INT32"),
            ],
            [{"name": "logits", "parameters": {"classification": 1}}],
        ),
        "tok-app",
        meta,
        8,
    )
    top = infer_response("tok-app", answer, asked, {})["outputs"]
    best = expected["logits"].argmax(1)
    assert [o["name"] for o in top] == ["logits"]
    assert [s.split(":")[1] for s in top[0]["data"]] == [str(b) for b in best]


def test_binary_inputs_in_json_order_and_a_binary_output(tokens):
    repo, expected = tokens
    mask, ids = INPUTS["attention_mask"].astype("<i4").tobytes(), INPUTS["input_ids"].astype("<i8").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "attention_mask",
                    "shape": [3, 8],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": len(mask)},
                },
                {
                    "name": "input_ids",
                    "shape": [3, 8],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": len(ids)},
                },
            ],
            "outputs": [{"name": "pooled", "parameters": {"binary_data": True}}],
        }
    ).encode()
    parsed = parse_infer_request(header + mask + ids, "tok-app", meta_of(repo), 8, len(header))
    np.testing.assert_array_equal(parsed.batch["input_ids"], INPUTS["input_ids"])
    with repo.load("tok", "onnx") as model:
        body, length = binary_infer_response("tok-app", model.predict(parsed.batch), parsed, {})
    head = json.loads(body[:length])
    (out,) = head["outputs"]
    assert out["name"] == "pooled" and out["parameters"]["binary_data_size"] == 3 * 4 * 4
    np.testing.assert_allclose(
        np.frombuffer(body[length:], "<f4").reshape(3, 4), expected["pooled"], atol=1e-5
    )


@pytest.mark.parametrize(
    ("inputs", "outputs", "says"),
    [
        (["input_ids"], None, "app 'tok-app' needs input(s) 'attention_mask', not sent"),
        (["input_ids", "attention_mask", "token_type_ids"], None, "has no input 'token_type_ids'"),
        (["input_ids", "input_ids", "attention_mask"], None, "input 'input_ids' is sent twice"),
        (
            ["input_ids", "attention_mask:FP32"],
            None,
            "input 'attention_mask': datatype 'FP32' does not fit its INT64",
        ),
        (["input_ids", "attention_mask:short"], None, "input 'attention_mask': shape [3, 4] does not match"),
        (["input_ids", "attention_mask:rows"], None, "the inputs' batch sizes differ"),
        (["input_ids", "attention_mask:half"], None, "INT64 data must be integers"),
        (["input_ids", "attention_mask"], [{"name": "hidden"}], "requested output 'hidden' is not an output"),
        (
            ["input_ids", "attention_mask"],
            [{"name": "logits", "parameters": {"classification": 4}}],
            "classification must be an integer in 1..3",
        ),
    ],
)
def test_a_wrong_tensor_is_refused_naming_it(tokens, inputs, outputs, says):
    repo, _ = tokens
    sent = []
    for item in inputs:
        name, _, how = item.partition(":")
        values = INPUTS.get(name, INPUTS["input_ids"])
        if how == "FP32":
            sent.append(tensor(name, values, "FP32"))
        elif how == "short":
            sent.append(tensor(name, values[:, :4]))
        elif how == "rows":
            sent.append(tensor(name, values[:2]))
        elif how == "half":
            sent.append({**tensor(name, values), "data": (values.ravel() + 0.5).tolist()})
        else:
            sent.append(tensor(name, values))
    with pytest.raises(InvalidRequestError) as caught:
        parse_infer_request(request(sent, outputs), "tok-app", meta_of(repo), 8)
    assert says in str(caught.value)


def test_metadata_lists_every_tensor(tokens):
    repo, _ = tokens
    meta = model_metadata("tok-app", "tok", meta_of(repo), ["onnx", "pt2"])
    assert meta["inputs"] == [
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, 8]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, 8]},
    ]
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("logits", [-1, 3]), ("pooled", [-1, 4])]


def test_a_sample_without_every_input_is_refused(tokens, tmp_path):
    repo, _ = tokens
    np.savez(tmp_path / "half.npz", input_ids=INPUTS["input_ids"])
    paths = examples.token_artefacts(tmp_path / "art")
    before = sorted(p.name for p in repo.root.rglob("*"))
    with pytest.raises(ConfigError, match=r"must hold one array per input .*missing 'attention_mask'"):
        add_variant(
            repo, AddRequest("tok", "again", paths["onnx"], accuracy=0.5, sample_file=tmp_path / "half.npz")
        )
    assert sorted(p.name for p in repo.root.rglob("*")) == before
