"""The KServe v2 / open inference protocol, as JSON: request parsing and response building.

A request names one input tensor with its shape, datatype and (row-major, flat or nested) data::

    {"id": "42", "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": [...]}],
     "parameters": {"timeout": 1.5}}

``parameters.timeout`` (seconds; or ``timeout_ms``) bounds the whole request, retries included.
Large tensors may travel as raw bytes instead (Triton's binary tensor extension): the body is the
JSON header, whose length the ``Inference-Header-Content-Length`` HTTP header gives, followed by the
tensor data, and the input says ``"parameters": {"binary_data_size": BYTES}`` instead of ``data``.

The input may be sent in any numeric KServe datatype (FP32, FP16, BF16, FP64, INT64, INT32, INT16,
INT8, UINT8, BOOL; binary data little-endian, BF16 as the upper halves of FP32 values); it is served
as FP32, the datatype every served model's input takes today. An app whose models take BYTES (texts)
takes BYTES elements, JSON strings or length-led binary ones. An image classifier's app (its
``ModelMeta.image``) also takes its images encoded, as OpenVINO Model Server does: a BYTES input of
shape ``[N]`` or ``[N, 1]`` whose elements are PNG or JPEG files (base64 strings, or ``{"b64": ...}``,
in JSON; the files' bytes, length-led, as binary data), decoded here with Pillow and prepared by the
family's image processor, so a corrupt image is refused before any server sees it.

The answer has one output, ``output``: the logits (FP32, ``[N, classes]``). Triton's *classification
extension* asks for the top classes instead: ``"outputs": [{"name": "output", "parameters":
{"classification": K}}]``
answers, per row, the K highest-scoring classes as a BYTES tensor of shape ``[N, K]`` whose elements
are ``"score:index"`` strings, highest score first (Triton's format: the score printed with six
decimals, then the class index), ``"score:index:label"`` where the app's models name their classes
(a user's model added with its ``id2label`` or ``--labels``).
A requested output may also say ``"binary_data": true`` (tritonclient's default), or the request
``"parameters": {"binary_data_output": true}``: the answer then comes as Triton sends it, the JSON
header (its length in the ``Inference-Header-Content-Length`` HTTP header) followed by the output's
raw little-endian bytes, the output saying ``"parameters": {"binary_data_size": BYTES}`` instead of
``data`` (a BYTES output: each element led by its 4-byte little-endian length). Large logits then
cost no JSON on either side.

Everything a client can get wrong is refused here with an :class:`~failsoft.errors.InvalidRequestError`
that says what is wrong (the gateway turns it into a 4xx ``{"error": ...}``), before any server sees
the request: malformed or too deeply nested JSON, a missing or extra input, a datatype other than
a number, a shape that is not the app's, more rows than ``max_batch``, data that does not fill the shape
or is not finite numbers, an output or classification count the app does not have. Messages quote
the bad value in a shortened form (a client's 10 MB list is not echoed back).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from failsoft.errors import InvalidRequestError
from failsoft.runtime.gateway import named
from failsoft.runtime.gateway.named import OutputAsk
from failsoft.runtime.gateway.tensors import WIRE_DTYPES, ModelMeta, classify, show
from failsoft.zoo.formats.images import ImageInput
from failsoft.zoo.formats.interface import TensorSpec

MAX_TIMEOUT_S = 600.0
OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class InferRequest:
    batch: np.ndarray
    request_id: str | None
    input_name: str
    timeout_s: float | None
    classification: int | None = None  # top-K classes asked for instead of the logits
    parameters: dict[str, Any] = field(default_factory=dict)  # the request's own, as sent
    labels: tuple[str, ...] = ()  # the app's class names, for the classification extension
    binary_output: bool = False  # answer with the binary tensor extension (Triton's binary_data)
    asks: tuple[OutputAsk, ...] = ()  # a model of several outputs: those asked for, in order
    output_specs: tuple[TensorSpec, ...] = ()  # and what each of its outputs is


def parse_infer_request(
    body: bytes, app: str, meta: ModelMeta, max_batch: int, header_length: int | None = None
) -> InferRequest:
    """Validate a request; ``header_length`` (Triton's ``Inference-Header-Content-Length``) marks a
    binary request: that many bytes of JSON, then the raw little-endian tensor data."""
    data, binary = _decode(body, header_length)
    if meta.named:
        return _parse_named(data, binary, app, meta, max_batch)
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidRequestError(
            f"app {app!r} takes exactly one input: 'inputs' must be a list of one object"
        )
    tensor = inputs[0]
    name = tensor.get("name", "input")
    if not isinstance(name, str):
        raise InvalidRequestError(f"input 'name' must be a string, got {show(name)}")
    datatype = tensor.get("datatype")
    takes = ("BYTES",) if meta.input_datatype == "BYTES" else tuple(WIRE_DTYPES)
    if meta.image is not None:
        takes = (*takes, "BYTES")
    if datatype not in takes:
        raise InvalidRequestError(
            f"input {show(name)}: datatype {show(datatype)} is not supported by app {app!r} "
            f"(its input takes {', '.join(takes)})"
        )
    params = tensor.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise InvalidRequestError(f"input {show(name)}: 'parameters' must be an object, got {show(params)}")
    if datatype == "BYTES" and meta.image is not None:
        batch = _images(tensor, binary, params, name, meta.image, max_batch)
    else:
        batch = _tensor(tensor, binary, params, name, datatype, app, meta, max_batch)
    request_id = _request_id(data)
    return InferRequest(
        batch,
        request_id,
        name,
        _timeout(data.get("parameters")),
        _classification(data.get("outputs"), app, meta),
        dict(data.get("parameters") or {}),
        meta.labels,
        _binary_output(data),
    )


def _request_id(data: dict[str, Any]) -> str | None:
    request_id = data.get("id")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
        raise InvalidRequestError(f"'id' must be a string, got {show(request_id)}")
    return None if request_id is None else str(request_id)


def _parse_named(
    data: dict[str, Any], binary: bytes, app: str, meta: ModelMeta, max_batch: int
) -> InferRequest:
    """A request to a model of several named inputs or outputs (:mod:`.named`)."""
    batch = named.parse_inputs(data.get("inputs"), binary, app, meta, max_batch)
    asks = named.requested_outputs(data.get("outputs"), app, meta, _binary_output(data, outputs=False))
    request_id = _request_id(data)
    return InferRequest(
        batch,
        request_id,
        meta.inputs[0].name,
        _timeout(data.get("parameters")),
        None,
        dict(data.get("parameters") or {}),
        meta.labels,
        any(a.binary for a in asks),
        asks,
        meta.outputs,
    )


def _tensor(
    tensor: dict[str, Any], binary: bytes, params: Any, name: str, datatype: str, app: str,
    meta: ModelMeta, max_batch: int,
) -> np.ndarray:  # fmt: skip
    """An input tensor of the app's own shape: numbers (JSON or binary), or BYTES elements."""
    shape = _shape(tensor.get("shape"), name, app, meta, max_batch)
    if datatype == "BYTES":
        return _bytes(tensor.get("data"), binary, params, shape, name)
    if params and "binary_data_size" in params:
        return _binary(binary, params["binary_data_size"], shape, name, datatype)
    return _data(tensor.get("data"), shape, name, datatype)


def _images(
    tensor: dict[str, Any], binary: bytes, params: Any, name: str, image: ImageInput, max_batch: int
) -> np.ndarray:
    """Encoded images, one per row (shape ``[N]`` or ``[N, 1]``), decoded to the app's pixels. In
    JSON each element is the file in base64 (a string, or ``{"b64": ...}`` as TensorFlow Serving and
    OpenVINO Model Server send it); in binary data, the file's bytes, length-led."""
    shape = tensor.get("shape")
    if not (
        isinstance(shape, list)
        and len(shape) in (1, 2)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        and shape[1:] in ([], [1])
    ):
        raise InvalidRequestError(
            f"input {show(name)}: encoded images take shape [N] or [N, 1] (one PNG or JPEG per row); "
            f"got {show(shape)}"
        )
    if not 1 <= shape[0] <= max_batch:
        raise InvalidRequestError(f"input {show(name)}: batch size {shape[0]} is outside 1..{max_batch}")
    if params and "binary_data_size" in params:
        encoded = list(_bytes(None, binary, params, tuple(shape), name).ravel())
    else:
        encoded = [_base64(e, name, i) for i, e in enumerate(_flatten(tensor.get("data"), name))]
        if len(encoded) != shape[0]:
            raise InvalidRequestError(
                f"input {show(name)}: {len(encoded)} images, shape {show(shape)} needs {shape[0]}"
            )
    return image.decode(encoded, name)


def _base64(element: Any, name: str, index: int) -> bytes:
    text = element.get("b64") if isinstance(element, dict) and len(element) == 1 else element
    if not isinstance(text, str):
        raise InvalidRequestError(
            f'input {show(name)}: element {index} must be a base64 string (or {{"b64": ...}}) '
            f"holding a PNG or JPEG file, got {show(element)}"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"input {show(name)}: element {index} is not base64: {exc}") from exc


def _binary_output(data: dict[str, Any], outputs: bool = True) -> bool:
    """Whether the answer should carry its output as raw bytes: the output's ``binary_data`` or the
    request's ``binary_data_output`` (both validated as booleans)."""
    params = data.get("parameters") or {}
    wanted = params.get("binary_data_output", False) if isinstance(params, dict) else False
    if not isinstance(wanted, bool):
        raise InvalidRequestError(f"parameters.binary_data_output must be true or false, got {show(wanted)}")
    if not outputs:
        return wanted
    outputs = data.get("outputs")
    if isinstance(outputs, list) and outputs and isinstance(outputs[0], dict):
        out_params = outputs[0].get("parameters")
        if isinstance(out_params, dict) and "binary_data" in out_params:
            wanted = bool(out_params["binary_data"])  # validated with the output's other parameters
    return wanted


def _loads(body: bytes) -> Any:
    """The body's JSON: orjson (a 3 MB tensor of floats in a sixth of the standard parser's CPU);
    what orjson refuses is read again by the standard parser, so that every body is read, and every
    error worded, as before (``NaN``, which it reads and the checks then refuse as not finite)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _decode(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    """The JSON object of a request, and the binary tensor data that follows it (if any)."""
    binary = b""
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise InvalidRequestError(
                f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes"
            )
        body, binary = body[:header_length], body[header_length:]
    try:
        data = _loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise InvalidRequestError("malformed JSON: nested too deeply") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("the body is not UTF-8 JSON") from exc
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise InvalidRequestError(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequestError(f"expected a JSON object, got {type(data).__name__}")
    return data, binary


def _shape(shape: Any, name: str, app: str, meta: ModelMeta, max_batch: int) -> tuple[int, ...]:
    want = f"[N, {', '.join(map(str, meta.input_shape))}]"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidRequestError(
            f"input {show(name)}: 'shape' must be a list of integers, like {want}; got {show(shape)}"
        )
    if len(shape) != len(meta.input_shape) + 1 or tuple(shape[1:]) != meta.input_shape:
        raise InvalidRequestError(
            f"input {show(name)}: shape {show(shape)} does not match app {app!r}, which takes {want}"
        )
    if not 1 <= shape[0] <= max_batch:
        raise InvalidRequestError(f"input {show(name)}: batch size {shape[0]} is outside 1..{max_batch}")
    return tuple(shape)


def _data(data: Any, shape: tuple[int, ...], name: str, datatype: str = "FP32") -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidRequestError(f"input {show(name)}: 'data' must be a list of numbers")
    try:
        with np.errstate(over="ignore"):  # beyond FP32 becomes inf, refused below
            arr = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidRequestError(f"input {show(name)}: 'data' must hold numbers only") from exc
    if datatype == "BOOL" and not np.isin(arr, (0.0, 1.0)).all():
        raise InvalidRequestError(f"input {show(name)}: BOOL data must be true or false")
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(WIRE_DTYPES[datatype])
        if not (
            np.isfinite(arr).all()
            and (arr == np.round(arr)).all()
            and info.min <= arr.min() <= arr.max() <= info.max
        ):
            raise InvalidRequestError(
                f"input {show(name)}: {datatype} data must be integers in {info.min}..{info.max}"
            )
    expected = math.prod(shape)
    if arr.size != expected:
        raise InvalidRequestError(
            f"input {show(name)}: 'data' has {arr.size} values, shape {list(shape)} needs {expected}"
        )
    return _finite(arr.reshape(shape), name)


def _binary(
    binary: bytes, size: Any, shape: tuple[int, ...], name: str, datatype: str = "FP32"
) -> np.ndarray:
    wire = np.dtype(WIRE_DTYPES[datatype])
    expected = math.prod(shape) * wire.itemsize
    if isinstance(size, bool) or size != expected or len(binary) != expected:
        raise InvalidRequestError(
            f"input {show(name)}: binary data of {len(binary)} bytes (binary_data_size {show(size)}); "
            f"shape {list(shape)} in {datatype} needs {expected}"
        )
    values = np.frombuffer(binary, dtype=wire)
    if datatype == "BF16":  # the upper 16 bits of an FP32
        values = (values.astype("<u4") << 16).view("<f4")
    with np.errstate(over="ignore"):
        return _finite(values.astype(np.float32).reshape(shape), name)


def _bytes(data: Any, binary: bytes, params: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A BYTES tensor: JSON strings (UTF-8), or binary elements each led by its 4-byte little-endian
    length (Triton's layout); an object array of ``bytes`` of ``shape``."""
    expected = math.prod(shape)
    if params and "binary_data_size" in params:
        size = params["binary_data_size"]
        if isinstance(size, bool) or size != len(binary):
            raise InvalidRequestError(
                f"input {show(name)}: binary data of {len(binary)} bytes (binary_data_size {show(size)})"
            )
        elements: list[bytes] = []
        at = 0
        while at < len(binary):
            length = struct.unpack_from("<I", binary, at)[0] if at + 4 <= len(binary) else len(binary)
            if at + 4 + length > len(binary):
                raise InvalidRequestError(
                    f"input {show(name)}: BYTES element {len(elements)} overruns the data"
                )
            elements.append(binary[at + 4 : at + 4 + length])
            at += 4 + length
    else:
        flat = _flatten(data, name)
        if not all(isinstance(e, str) for e in flat):
            raise InvalidRequestError(f"input {show(name)}: BYTES 'data' must hold strings only")
        elements = [e.encode("utf-8") for e in flat]
    if len(elements) != expected:
        raise InvalidRequestError(
            f"input {show(name)}: {len(elements)} BYTES elements, shape {list(shape)} needs {expected}"
        )
    out = np.empty(expected, dtype=object)
    out[:] = elements
    return out.reshape(shape)


def _flatten(data: Any, name: str, depth: int = 0) -> list[Any]:
    if not isinstance(data, list) or depth > 32:
        raise InvalidRequestError(f"input {show(name)}: 'data' must be a (nested) list of strings")
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item, name, depth + 1) if isinstance(item, list) else [item])
    return out


def _finite(batch: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(batch).all():
        raise InvalidRequestError(
            f"input {show(name)}: data holds values that are not finite in FP32 "
            "(NaN, Infinity, or beyond ±3.4e38)"
        )
    return batch


def _timeout(parameters: Any) -> float | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"'parameters' must be an object, got {show(parameters)}")
    if "timeout_ms" in parameters:
        value, scale, unit = parameters["timeout_ms"], 1000.0, "timeout_ms"
    elif "timeout" in parameters:
        value, scale, unit = parameters["timeout"], 1.0, "timeout"
    else:
        return None
    seconds = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value) / scale
        except OverflowError:  # an integer beyond any float
            seconds = math.inf
    if not 0 < seconds <= MAX_TIMEOUT_S:
        limit = MAX_TIMEOUT_S * scale
        raise InvalidRequestError(f"parameters.{unit} must be a number in (0, {limit:g}] ({show(value)})")
    return seconds


def _classification(outputs: Any, app: str, meta: ModelMeta) -> int | None:
    """The K of Triton's classification extension, or None for the logits."""
    if outputs is None or outputs == []:
        return None
    if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict):
        raise InvalidRequestError(
            f"app {app!r} has one output, {OUTPUT!r}: 'outputs' must be a list of one object"
        )
    name, params = outputs[0].get("name"), outputs[0].get("parameters")
    if name != OUTPUT:
        raise InvalidRequestError(
            f"requested output {show(name)} is not an output of app {app!r} (its output: {OUTPUT!r})"
        )
    if params is None:
        return None
    k = named.output_parameters(OUTPUT, params).get("classification")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= meta.num_classes:
        raise InvalidRequestError(
            f"output {OUTPUT!r}: classification must be an integer in 1..{meta.num_classes} "
            f"(app {app!r} has {meta.num_classes} classes), got {show(k)}"
        )
    return k


def infer_response(
    app: str, outputs: np.ndarray | None, request: InferRequest, parameters: dict[str, Any]
) -> dict[str, Any]:
    """The v2 response; a request dropped to keep others in their SLO (``outputs`` None) has no outputs."""
    tensors = [] if outputs is None else [t for t, _ in _output_tensors(outputs, request, binary=False)]
    return _response(app, tensors, request, parameters)


def binary_infer_response(
    app: str, outputs: np.ndarray | None, request: InferRequest, parameters: dict[str, Any]
) -> tuple[bytes, int]:
    """The v2 response with the binary tensor extension: the body (JSON header, then the output's
    raw bytes) and the header's length for ``Inference-Header-Content-Length``. The output's values
    never pass through JSON."""
    answered = [] if outputs is None else _output_tensors(outputs, request, binary=True)
    tensors, raw = [t for t, _ in answered], b"".join(r for _, r in answered)
    header = json.dumps(_response(app, tensors, request, parameters), separators=(",", ":")).encode()
    return header + raw, len(header)


def _output_tensors(
    outputs: np.ndarray, request: InferRequest, binary: bool
) -> list[tuple[dict[str, Any], bytes]]:
    """The answer's outputs, each with its raw bytes (empty where it is answered in JSON)."""
    if request.asks:
        return named.output_tensors(np.asarray(outputs), request.asks, request.output_specs, request.labels)
    return [_output_tensor(outputs, request, binary)]


def _output_tensor(outputs: np.ndarray, request: InferRequest, binary: bool) -> tuple[dict[str, Any], bytes]:
    """The answer's output: its JSON description with ``data``, or, ``binary``, with its
    ``binary_data_size`` and the raw bytes (little-endian FP32; BYTES elements length-led)."""
    out = np.asarray(outputs, dtype=np.float32)
    if request.classification is not None:
        top = classify(out, request.classification, request.labels)
        elements = [s for row in top for s in row]
        tensor: dict[str, Any] = {
            "name": OUTPUT,
            "datatype": "BYTES",
            "shape": [len(top), request.classification],
        }
        if not binary:
            return {**tensor, "data": elements}, b""
        raw = b"".join(struct.pack("<I", len(b)) + b for b in (e.encode("utf-8") for e in elements))
    else:
        tensor = {"name": OUTPUT, "datatype": "FP32", "shape": list(out.shape)}
        if not binary:
            return {**tensor, "data": out.ravel().tolist()}, b""
        raw = out.astype("<f4").tobytes()
    return {**tensor, "parameters": {"binary_data_size": len(raw)}}, raw


def _response(
    app: str, tensors: list[dict[str, Any]], request: InferRequest, parameters: dict[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_name": app,
        "model_version": parameters.get("variant"),
        "outputs": tensors,
        "parameters": parameters,
    }
    if request.request_id is not None:
        body["id"] = request.request_id
    return body


def model_metadata(app: str, family: str, meta: ModelMeta, variants: list[str]) -> dict[str, Any]:
    """The app's model metadata: every input and output, the batch dimension as ``-1``; an image
    classifier's input says it also takes encoded images."""
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    if meta.named:
        inputs = [{**t.to_dict(), "shape": [-1, *t.shape]} for t in meta.inputs]
        outputs = [{**t.to_dict(), "shape": [-1, *t.shape]} for t in meta.outputs]
    else:
        inputs = [{"name": "input", "datatype": meta.input_datatype, "shape": [-1, *meta.input_shape]}]
        outputs = [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, meta.num_classes]}]
    if meta.image is not None:
        inputs[0]["parameters"] = {
            "encoded_images": {"datatype": "BYTES", "shape": [-1], "formats": ["PNG", "JPEG"]}
        }
    return {
        "name": app,
        "versions": variants,
        "platform": f"failsoft/{family}",
        "inputs": inputs,
        "outputs": outputs,
    }
