"""KServe v2 datatypes on the wire: every numeric datatype in JSON and in binary becomes the FP32 batch
the models take; a value its datatype cannot hold is a 400 naming it; labelled classes answer
``score:index:label`` (no Ray here)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.runtime.gateway.protocol import ModelMeta, classify, infer_response, parse_infer_request
from failsoft.runtime.metadata import _family_labels

META = ModelMeta((4,), 3, ("cat", "dog", "bird"))
VALUES = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])


def json_body(datatype: str, data: list) -> bytes:
    tensor = {"name": "input", "shape": [2, 4], "datatype": datatype, "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


def binary_body(
    datatype: str, raw: bytes, name: str = "input", shape: tuple[int, ...] = (2, 4)
) -> tuple[bytes, int]:
    """A binary request: the JSON header (its length returned too), then ``raw``."""
    params = {"binary_data_size": len(raw)}
    tensor = {"name": name, "shape": list(shape), "datatype": datatype, "parameters": params}
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + raw, len(header)


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT64", "INT32", "INT16", "INT8", "UINT8"])
def test_every_numeric_datatype_arrives_as_float32_in_json_and_in_binary(datatype):
    wire = {"FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4", "INT16": "<i2",
            "INT8": "i1", "UINT8": "u1"}[datatype]  # fmt: skip
    from_json = parse_infer_request(json_body(datatype, VALUES.tolist()), "app", META, 8).batch
    raw, length = binary_body(datatype, VALUES.astype(wire).tobytes())
    from_binary = parse_infer_request(raw, "app", META, 8, length).batch
    for batch in (from_json, from_binary):
        assert batch.dtype == np.float32
        np.testing.assert_array_equal(batch, VALUES)


def test_bf16_and_bool_in_binary():
    values = np.array([[0.5, -2.0, 3.0, 1e3]] * 2, dtype=np.float32)
    bf16 = (values.view("<u4") >> 16).astype("<u2").tobytes()  # bf16: the upper half of each FP32
    raw, length = binary_body("BF16", bf16)
    np.testing.assert_array_equal(parse_infer_request(raw, "app", META, 8, length).batch, values)
    flags = np.array([[True, False, True, True]] * 2)
    raw, length = binary_body("BOOL", flags.tobytes())
    np.testing.assert_array_equal(
        parse_infer_request(raw, "app", META, 8, length).batch, flags.astype(np.float32)
    )


@pytest.mark.parametrize(
    ("request_body", "says"),
    [
        (json_body("INT8", [300] * 8), "INT8 data must be integers in -128..127"),
        (json_body("UINT8", [1.5] * 8), "UINT8 data must be integers in 0..255"),
        (json_body("BOOL", [2] * 8), "BOOL data must be true or false"),
        (json_body("BYTES", ["a"] * 8), "datatype 'BYTES' is not supported"),
        (binary_body("INT64", b"\0" * 32)[0], "binary data of 32 bytes"),
    ],
)
def test_a_value_its_datatype_cannot_hold_is_a_400_naming_it(request_body, says):
    length = binary_body("INT64", b"\0" * 32)[1] if b"binary_data_size" in request_body else None
    with pytest.raises(InvalidRequestError) as err:
        parse_infer_request(request_body, "app", META, 8, length)
    assert says in str(err.value)
    assert err.value.status == 400


def test_labelled_classes_answer_score_index_label():
    logits = np.array([[0.1, 2.0, -1.0]], dtype=np.float32)
    assert classify(logits, 2, META.labels) == [["2.000000:1:dog", "0.100000:0:cat"]]
    asked = json.dumps({
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}],
        "outputs": [{"name": "output", "parameters": {"classification": 1}}],
    }).encode()  # fmt: skip
    request = parse_infer_request(asked, "app", META, 8)
    assert infer_response("app", logits, request, {})["outputs"][0]["data"] == ["2.000000:1:dog"]


def test_a_family_answers_with_the_labels_its_variants_agree_on():
    assert _family_labels("img", {"hf": ("a", "b"), "onnx": ()}) == ("a", "b")
    assert _family_labels("img", {"onnx": ()}) == ()
    with pytest.raises(ConfigError, match="name their classes differently"):
        _family_labels("img", {"hf": ("a", "b"), "pt2": ("b", "a")})


TEXT = ModelMeta((1,), 2, ("negative", "positive"), "BYTES")


def test_bytes_inputs_arrive_as_python_bytes_from_json_strings_and_binary():
    tensor = {"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": ["a good film", "été"]}
    batch = parse_infer_request(json.dumps({"inputs": [tensor]}).encode(), "app", TEXT, 8).batch
    assert batch.dtype == object and batch.shape == (2, 1)
    assert batch.ravel().tolist() == [b"a good film", "été".encode()]
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in (b"one", b"\x89PNG"))
    body, length = binary_body("BYTES", raw, "text", (2, 1))
    batch = parse_infer_request(body, "app", TEXT, 8, length).batch
    assert batch.ravel().tolist() == [b"one", b"\x89PNG"]


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        ({"datatype": "FP32", "data": [1.0]}, "its input takes BYTES"),
        ({"datatype": "BYTES", "data": [1]}, "BYTES 'data' must hold strings only"),
        ({"datatype": "BYTES", "data": ["a", "b"]}, "2 BYTES elements, shape [1, 1] needs 1"),
        ({"datatype": "BYTES", "data": "a"}, "'data' must be a (nested) list of strings"),
    ],
)
def test_a_bytes_app_refuses_what_is_not_its_strings(tensor, says):
    request = {"inputs": [{"name": "text", "shape": [1, 1], **tensor}]}
    with pytest.raises(InvalidRequestError) as err:
        parse_infer_request(json.dumps(request).encode(), "app", TEXT, 8)
    assert says in str(err.value)


def test_binary_bytes_elements_that_overrun_the_data_are_refused():
    raw = (100).to_bytes(4, "little") + b"short"
    body, length = binary_body("BYTES", raw, "text", (1, 1))
    with pytest.raises(InvalidRequestError, match="BYTES element 0 overruns the data"):
        parse_infer_request(body, "app", TEXT, 8, length)
