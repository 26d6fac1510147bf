"""KServe v2 request parsing: every client mistake is a 4xx that says what is wrong (no Ray here)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from failsoft.errors import InvalidRequestError
from failsoft.runtime.gateway.protocol import ModelMeta, classify, infer_response, parse_infer_request

META = ModelMeta((4,), 10)


def body(**overrides) -> bytes:
    tensor = {"name": "input", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))}
    tensor.update(overrides)
    return json.dumps({"inputs": [tensor], "parameters": {"timeout": 1.5}}).encode()


def test_a_good_request_becomes_a_float32_batch_with_its_deadline():
    req = parse_infer_request(body(data=[[0, 1, 2, 3], [4, 5, 6, 7]]), "app", META, 8)
    assert req.batch.dtype == np.float32 and req.batch.shape == (2, 4)
    assert req.batch[1, 3] == 7 and req.timeout_s == 1.5


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "expected a JSON object"),
        (json.dumps({"inputs": []}).encode(), 400, "exactly one input"),
        (body(datatype="BYTES"), 400, "datatype 'BYTES' is not supported"),
        (body(shape=[2, 5]), 400, "shape [2, 5] does not match app 'app', which takes [N, 4]"),
        (body(shape=[9, 4], data=list(range(36))), 400, "batch size 9 is outside 1..8"),
        (body(data=[1, 2, 3]), 400, "'data' has 3 values, shape [2, 4] needs 8"),
        (body(data=["a"] * 8), 400, "'data' must hold numbers only"),
        (body(shape="2x4"), 400, "'shape' must be a list of integers"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(raw, status, says):
    with pytest.raises(InvalidRequestError) as err:
        parse_infer_request(raw, "app", META, 8)
    assert err.value.status == status
    assert says in str(err.value)


def test_timeouts_are_bounded():
    raw = json.dumps({"inputs": json.loads(body())["inputs"], "parameters": {"timeout_ms": 0}}).encode()
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        parse_infer_request(raw, "app", META, 8)


def test_binary_tensors_follow_tritons_extension():
    data = np.arange(8, dtype="<f4").reshape(2, 4)
    head = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}
            ]
        }
    ).encode()
    req = parse_infer_request(head + data.tobytes(), "app", META, 8, header_length=len(head))
    assert np.array_equal(req.batch, data)
    with pytest.raises(InvalidRequestError, match="binary data of 28 bytes"):
        parse_infer_request(head + data.tobytes()[:-4], "app", META, 8, header_length=len(head))


def raw(**top) -> bytes:
    return json.dumps({"inputs": json.loads(body())["inputs"], **top}).encode()


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"inputs": [' + b"[" * 5_000 + b"]" * 5_000 + b"]}", "nested too deeply"),
        (b'{"inputs": [{"data": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}]}", "datatype None"),
        (b'{"id": ' + b"9" * 5000 + b"}", "malformed JSON"),
        (body(data=[10**400] * 8), "numbers only"),
        (body(data=[1e39] * 8), "not finite"),
        (body(data=[float("nan"), *range(7)]), "not finite"),  # Python's json writes and reads NaN
        (body(parameters=5), "'parameters' must be an object"),
        (raw(parameters={"timeout": 10**400}), "parameters.timeout must be a number"),
        (raw(parameters={"timeout": [[[[[[[[1]]]]]]]]}), "[[[[...]]]]"),
        (raw(id=True), "'id' must be a string"),
        (body(datatype="x" * 10_000), "'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx'"),
    ],
)
def test_hostile_bodies_are_refused_with_a_short_reason(payload, says):
    with pytest.raises(InvalidRequestError) as err:
        parse_infer_request(payload, "app", META, 8)
    assert err.value.status == 400 and says in str(err.value)
    assert len(str(err.value)) < 300  # the body is never echoed back whole


def test_classification_asks_for_the_top_k_and_is_validated():
    asked = parse_infer_request(
        raw(outputs=[{"name": "output", "parameters": {"classification": 2}}]), "app", META, 8
    )
    assert asked.classification == 2
    plain = parse_infer_request(
        raw(outputs=[{"name": "output", "parameters": {"binary_data": True}}]), "app", META, 8
    )
    assert plain.classification is None and plain.binary_output  # tritonclient's default: binary answer
    assert not parse_infer_request(raw(), "app", META, 8).binary_output
    asked_for_all = parse_infer_request(raw(parameters={"binary_data_output": True}), "app", META, 8)
    assert asked_for_all.binary_output
    with pytest.raises(InvalidRequestError, match="binary_data_output must be true or false"):
        parse_infer_request(raw(parameters={"binary_data_output": "yes"}), "app", META, 8)
    for outputs, says in [
        ([{"name": "output", "parameters": {"classification": 11}}], "integer in 1..10"),
        ([{"name": "output", "parameters": {"classification": 2.0}}], "got 2.0"),
        ([{"name": "output", "parameters": {"top": 2}}], "unsupported parameter 'top'"),
        ([{"name": "output"}, {"name": "output"}], "'outputs' must be a list of one object"),
        ([{"name": "logits"}], "its output: 'output'"),
        ({"name": "output"}, "'outputs' must be a list"),
    ]:
        with pytest.raises(InvalidRequestError, match=re.escape(says)):
            parse_infer_request(raw(outputs=outputs), "app", META, 8)


def test_classify_writes_tritons_score_index_strings_best_first():
    logits = np.array([[0.5, 2.25, -1.0, 2.25], [3.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    assert classify(logits, 3) == [
        ["2.250000:1", "2.250000:3", "0.500000:0"],
        ["3.000000:0", "2.000000:3", "1.000000:2"],
    ]
    request = parse_infer_request(
        raw(outputs=[{"name": "output", "parameters": {"classification": 2}}]), "app", META, 8
    )
    out = infer_response("app", logits, request, {"variant": "v"})["outputs"][0]
    assert (out["datatype"], out["shape"], out["data"]) == (
        "BYTES",
        [2, 2],
        ["2.250000:1", "2.250000:3", "3.000000:0", "2.000000:3"],
    )
