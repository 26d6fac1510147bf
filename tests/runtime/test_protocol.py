"""KServe v2 request parsing: every client mistake is a 4xx that says what is wrong (no Ray here)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from failsoft.errors import InvalidRequestError
from failsoft.runtime.gateway.protocol import ModelMeta, parse_infer_request

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
        (body(datatype="INT64"), 400, "datatype 'INT64' is not supported"),
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
