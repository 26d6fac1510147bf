"""The KServe v2 / open inference protocol, as JSON: request parsing and response building.

A request names one input tensor with its shape, datatype and (row-major, flat or nested) data::

    {"id": "42", "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": [...]}],
     "parameters": {"timeout": 1.5}}

``parameters.timeout`` (seconds; or ``timeout_ms``) bounds the whole request, retries included.
Large tensors may travel as raw bytes instead (Triton's binary tensor extension): the body is the
JSON header, whose length the ``Inference-Header-Content-Length`` HTTP header gives, followed by the
FP32 data, and the input says ``"parameters": {"binary_data_size": BYTES}`` instead of ``data``.
Everything a client can get wrong is refused here with an :class:`~failsoft.errors.InvalidRequestError`
that says what is wrong (the gateway turns it into a 4xx ``{"error": ...}``), before any server sees
the request: malformed JSON, a missing or extra input, a datatype other than FP32, a shape that is
not the app's, more rows than ``max_batch``, data that does not fill the shape or is not numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from failsoft.errors import InvalidRequestError

MAX_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What the gateway must know of an app's family to validate requests (all variants share it)."""

    input_shape: tuple[int, ...]
    num_classes: int


@dataclass(frozen=True, slots=True)
class InferRequest:
    batch: np.ndarray
    request_id: str | None
    input_name: str
    timeout_s: float | None


def parse_infer_request(
    body: bytes, app: str, meta: ModelMeta, max_batch: int, header_length: int | None = None
) -> InferRequest:
    """Validate a request; ``header_length`` (Triton's ``Inference-Header-Content-Length``) marks a
    binary request: that many bytes of JSON, then the raw little-endian tensor data."""
    data, binary = _decode(body, header_length)
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidRequestError(
            f"app {app!r} takes exactly one input: 'inputs' must be a list of one object"
        )
    tensor = inputs[0]
    name = tensor.get("name", "input")
    if not isinstance(name, str):
        raise InvalidRequestError("input 'name' must be a string")
    datatype = tensor.get("datatype")
    if datatype != "FP32":
        raise InvalidRequestError(
            f"input {name!r}: datatype {datatype!r} is not supported by app {app!r} (use FP32)"
        )
    shape = _shape(tensor.get("shape"), name, app, meta, max_batch)
    params = tensor.get("parameters") or {}
    if isinstance(params, dict) and "binary_data_size" in params:
        batch = _binary(binary, params["binary_data_size"], shape, name)
    else:
        batch = _data(tensor.get("data"), shape, name)
    request_id = data.get("id")
    if request_id is not None and not isinstance(request_id, (str, int)):
        raise InvalidRequestError("'id' must be a string")
    return InferRequest(
        batch, None if request_id is None else str(request_id), name, _timeout(data.get("parameters"))
    )


def _decode(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    """The JSON object of a request, and the binary tensor data that follows it (if any)."""
    binary = b""
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise InvalidRequestError(f"Inference-Header-Content-Length {header_length} exceeds the body")
        body, binary = body[:header_length], body[header_length:]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("the body is not UTF-8 JSON") from exc
    if not isinstance(data, dict):
        raise InvalidRequestError(f"expected a JSON object, got {type(data).__name__}")
    return data, binary


def _shape(shape: Any, name: str, app: str, meta: ModelMeta, max_batch: int) -> tuple[int, ...]:
    want = f"[N, {', '.join(map(str, meta.input_shape))}]"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidRequestError(f"input {name!r}: 'shape' must be a list of integers, like {want}")
    if len(shape) != len(meta.input_shape) + 1 or tuple(shape[1:]) != meta.input_shape:
        raise InvalidRequestError(
            f"input {name!r}: shape {shape} does not match app {app!r}, which takes {want}"
        )
    if not 1 <= shape[0] <= max_batch:
        raise InvalidRequestError(f"input {name!r}: batch size {shape[0]} is outside 1..{max_batch}")
    return tuple(shape)


def _data(data: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidRequestError(f"input {name!r}: 'data' must be a list of numbers")
    try:
        arr = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"input {name!r}: 'data' must hold numbers only") from exc
    expected = math.prod(shape)
    if arr.size != expected:
        raise InvalidRequestError(
            f"input {name!r}: 'data' has {arr.size} values, shape {list(shape)} needs {expected}"
        )
    return arr.reshape(shape)


def _binary(binary: bytes, size: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    expected = math.prod(shape) * 4
    if size != expected or len(binary) != expected:
        raise InvalidRequestError(
            f"input {name!r}: binary data of {len(binary)} bytes (binary_data_size {size!r}); "
            f"shape {list(shape)} in FP32 needs {expected}"
        )
    return np.frombuffer(binary, dtype="<f4").reshape(shape)


def _timeout(parameters: Any) -> float | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidRequestError("'parameters' must be an object")
    if "timeout_ms" in parameters:
        value, scale, unit = parameters["timeout_ms"], 1000.0, "timeout_ms"
    elif "timeout" in parameters:
        value, scale, unit = parameters["timeout"], 1.0, "timeout"
    else:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value / scale <= MAX_TIMEOUT_S
    ):
        raise InvalidRequestError(
            f"parameters.{unit} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] ({value!r})"
        )
    return value / scale


def infer_response(
    app: str, outputs: np.ndarray, request_id: str | None, parameters: dict[str, Any]
) -> dict[str, Any]:
    out = np.asarray(outputs, dtype=np.float32)
    body: dict[str, Any] = {
        "model_name": app,
        "model_version": parameters.get("variant"),
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": list(out.shape), "data": out.ravel().tolist()}
        ],
        "parameters": parameters,
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def model_metadata(app: str, family: str, meta: ModelMeta, variants: list[str]) -> dict[str, Any]:
    return {
        "name": app,
        "versions": variants,
        "platform": f"failsoft/{family}",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, *meta.input_shape]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, meta.num_classes]}],
    }
