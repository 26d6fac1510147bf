"""Several named inputs and outputs on the wire, for a model that takes or answers more than one tensor.

A user's model may take several tensors (``input_ids`` and ``attention_mask``) and answer several
(``logits`` and an embedding). Its app's :class:`~failsoft.runtime.gateway.protocol.ModelMeta`
declares them all (``inputs``, ``outputs``: names, datatypes, shapes of one row), and a request
names each input as KServe v2 / Triton clients send them::

    {"inputs": [{"name": "input_ids", "shape": [2, 8], "datatype": "INT64", "data": [...]},
                {"name": "attention_mask", "shape": [2, 8], "datatype": "INT64", "data": [...]}],
     "outputs": [{"name": "logits"}]}

Every declared input must be there once, with the app's row shape and the same batch size as the
others; its datatype must be one the tensor can hold without a change of kind (a float input takes
any numeric datatype, an integer input the integer ones, BOOL only BOOL). Binary tensor data is read
in the order of the inputs in the JSON, as Triton lays it out. The batch travels to the servers as
one structured array, one field per input (:func:`~failsoft.zoo.formats.interface.records`), which
the serving queues batch like any other; the answer comes back the same way, and the outputs asked
for (all of them when ``outputs`` is absent) are answered by name, each in its own datatype, each as
JSON or, with ``binary_data``, as raw bytes; ``classification`` works on any float vector output.

Variants of a family may name their tensors differently: tensors are matched by position, and the
app answers with the names of its family's first variant. Everything wrong is one
:class:`~failsoft.errors.InvalidRequestError` naming the tensor.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.errors import InvalidRequestError
from failsoft.zoo.formats.interface import NUMPY_DTYPES, TensorSpec, records

if TYPE_CHECKING:
    from failsoft.runtime.gateway.tensors import ModelMeta

INTEGERS = ("INT64", "INT32", "INT16", "INT8", "UINT8")
FLOATS = ("FP32", "FP16", "BF16", "FP64")
OUTPUT_PARAMETERS = ("classification", "binary_data")


@dataclass(frozen=True, slots=True)
class OutputAsk:
    """One output a request asks for: by its position in the model's outputs, how it is answered."""

    index: int
    classification: int | None = None
    binary: bool = False


def accepted(datatype: str) -> tuple[str, ...]:
    """The datatypes an input of ``datatype`` may be sent in."""
    if datatype in FLOATS:
        return (*FLOATS, *INTEGERS, "BOOL")
    if datatype in INTEGERS:
        return (*INTEGERS, "BOOL")
    return (datatype,)


def parse_inputs(inputs: Any, binary: bytes, app: str, meta: ModelMeta, max_batch: int) -> np.ndarray:
    """Every declared input, by name, as one structured batch (one field per input)."""
    from failsoft.runtime.gateway.tensors import show

    specs = meta.inputs
    names = [t.name for t in specs]
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise InvalidRequestError(
            f"app {app!r} takes inputs {', '.join(names)}: 'inputs' must be a list of objects"
        )
    sent: dict[str, dict[str, Any]] = {}
    for tensor in inputs:
        name = tensor.get("name")
        if name not in names:
            raise InvalidRequestError(
                f"app {app!r} has no input {show(name)} (its inputs: {', '.join(names)})"
            )
        if name in sent:
            raise InvalidRequestError(f"input {name!r} is sent twice")
        sent[name] = tensor
    missing = [n for n in names if n not in sent]
    if missing:
        raise InvalidRequestError(f"app {app!r} needs input(s) {', '.join(map(repr, missing))}, not sent")
    cursor = _Cursor(binary)
    batches: dict[str, np.ndarray] = {}
    for tensor in inputs:  # binary data comes in the order the JSON lists the inputs
        spec = specs[names.index(tensor["name"])]
        batches[spec.name] = _input(tensor, spec, cursor, app, max_batch)
    if cursor.left:
        raise InvalidRequestError(f"{cursor.left} bytes of binary data follow the inputs unread")
    rows = {n: len(b) for n, b in batches.items()}
    if len(set(rows.values())) > 1:
        raise InvalidRequestError(
            "the inputs' batch sizes differ (" + ", ".join(f"{n}: {r}" for n, r in rows.items()) + ")"
        )
    return records(batches, specs)


class _Cursor:
    """Reads binary tensor data input after input."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, size: int) -> bytes:
        chunk = self.data[self.at : self.at + size]
        self.at += len(chunk)
        return chunk


def _input(tensor: dict[str, Any], spec: TensorSpec, cursor: _Cursor, app: str, max_batch: int) -> np.ndarray:
    from failsoft.runtime.gateway.tensors import WIRE_DTYPES, show

    name, datatype = spec.name, tensor.get("datatype")
    takes = accepted(spec.datatype)
    if datatype not in takes:
        raise InvalidRequestError(
            f"input {name!r}: datatype {show(datatype)} does not fit its {spec.datatype} "
            f"(it takes {', '.join(takes)})"
        )
    want = [-1 if d == -1 else d for d in spec.shape]
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or len(shape) != len(spec.shape) + 1
        or not spec.accepts(tuple(shape[1:]))
    ):
        raise InvalidRequestError(
            f"input {name!r}: shape {show(shape)} does not match app {app!r}, which takes [N, "
            f"{', '.join(map(str, want))}]"
        )
    if not 1 <= shape[0] <= max_batch:
        raise InvalidRequestError(f"input {name!r}: batch size {shape[0]} is outside 1..{max_batch}")
    params = tensor.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequestError(f"input {name!r}: 'parameters' must be an object, got {show(params)}")
    count = math.prod(shape)
    if "binary_data_size" in params:
        wire = np.dtype(WIRE_DTYPES[datatype])
        size = params["binary_data_size"]
        raw = cursor.take(count * wire.itemsize)
        if isinstance(size, bool) or size != count * wire.itemsize or len(raw) != size:
            raise InvalidRequestError(
                f"input {name!r}: binary data of {len(raw)} bytes (binary_data_size {show(size)}); "
                f"shape {shape} in {datatype} needs {count * wire.itemsize}"
            )
        values = np.frombuffer(raw, dtype=wire)
        if datatype == "BF16":
            values = (values.astype("<u4") << 16).view("<f4")
        values = values.astype(np.float64)
    else:
        values = _json_values(tensor.get("data"), name)
        if values.size != count:
            raise InvalidRequestError(
                f"input {name!r}: 'data' has {values.size} values, shape {shape} needs {count}"
            )
    _check_range(values, name, datatype)
    return values.reshape(shape).astype(NUMPY_DTYPES[spec.datatype])


def _json_values(data: Any, name: str) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidRequestError(f"input {name!r}: 'data' must be a list of numbers")
    try:
        return np.asarray(data, dtype=np.float64).ravel()
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidRequestError(f"input {name!r}: 'data' must hold numbers only") from exc


def _check_range(values: np.ndarray, name: str, datatype: str) -> None:
    """Values the sent datatype can hold: finite; integers in its range; BOOL 0 or 1."""
    if not np.isfinite(values).all():
        raise InvalidRequestError(f"input {name!r}: data holds values that are not finite (NaN, Infinity)")
    if datatype == "BOOL" and not np.isin(values, (0.0, 1.0)).all():
        raise InvalidRequestError(f"input {name!r}: BOOL data must be true or false")
    if datatype in INTEGERS and values.size:
        info = np.iinfo(NUMPY_DTYPES[datatype])
        if not ((values == np.round(values)).all() and info.min <= values.min() <= values.max() <= info.max):
            raise InvalidRequestError(
                f"input {name!r}: {datatype} data must be integers in {info.min}..{info.max}"
            )


def requested_outputs(outputs: Any, app: str, meta: ModelMeta, binary_default: bool) -> tuple[OutputAsk, ...]:
    """The outputs asked for, in the order asked (every output when none is named)."""
    from failsoft.runtime.gateway.tensors import show

    names = [t.name for t in meta.outputs]
    if outputs is None or outputs == []:
        return tuple(OutputAsk(i, None, binary_default) for i in range(len(names)))
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InvalidRequestError(f"'outputs' must be a list of objects naming outputs of app {app!r}")
    asks, seen = [], set()
    for out in outputs:
        name = out.get("name")
        if name not in names:
            raise InvalidRequestError(
                f"requested output {show(name)} is not an output of app {app!r} "
                f"(its outputs: {', '.join(names)})"
            )
        if name in seen:
            raise InvalidRequestError(f"output {name!r} is asked for twice")
        seen.add(name)
        spec = meta.outputs[names.index(name)]
        params = output_parameters(name, out.get("parameters") or {})
        binary = params.get("binary_data", binary_default)
        asks.append(OutputAsk(names.index(name), _top_k(params.get("classification"), spec), binary))
    return tuple(asks)


def output_parameters(name: str, params: Any) -> dict[str, Any]:
    """A requested output's ``parameters``, checked: an object of known keys, ``binary_data`` a bool."""
    from failsoft.runtime.gateway.tensors import show

    if not isinstance(params, dict):
        raise InvalidRequestError(f"output {name!r}: 'parameters' must be an object, got {show(params)}")
    unknown = sorted(str(p) for p in params if p not in OUTPUT_PARAMETERS)
    if unknown:
        raise InvalidRequestError(
            f"output {name!r}: unsupported parameter {show(unknown[0])} "
            f"(supported: {', '.join(OUTPUT_PARAMETERS)})"
        )
    if not isinstance(params.get("binary_data", False), bool):
        raise InvalidRequestError(f"output {name!r}: binary_data must be true or false")
    return params


def _top_k(k: Any, spec: TensorSpec) -> int | None:
    if k is None:
        return None
    classes = spec.shape[0] if len(spec.shape) == 1 and spec.datatype in FLOATS else 0
    if classes < 1:
        raise InvalidRequestError(
            f"output {spec.name!r}: classification needs a float vector, it is {spec.describe()}"
        )
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= classes:
        raise InvalidRequestError(
            f"output {spec.name!r}: classification must be an integer in 1..{classes}, got {k!r}"
        )
    return k


def output_tensors(
    outputs: np.ndarray, asks: tuple[OutputAsk, ...], specs: tuple[TensorSpec, ...], labels: tuple[str, ...]
) -> list[tuple[dict[str, Any], bytes]]:
    """Each asked output's description with ``data``, or with ``binary_data_size`` and its raw bytes
    (little-endian; BYTES elements length-led). ``outputs`` is the answer's structured batch (one
    field per output, by position) or, for a model of one output, that output's array."""
    from failsoft.runtime.gateway.tensors import WIRE_DTYPES, classify

    fields = outputs.dtype.names
    out = []
    for ask in asks:
        spec = specs[ask.index]
        arr = np.asarray(outputs[fields[ask.index]] if fields else outputs)
        if ask.classification is not None:
            top = classify(arr, ask.classification, labels if ask.index == 0 else ())
            elements = [s for row in top for s in row]
            tensor: dict[str, Any] = {
                "name": spec.name,
                "datatype": "BYTES",
                "shape": [len(top), ask.classification],
            }
            if not ask.binary:
                out.append(({**tensor, "data": elements}, b""))
                continue
            raw = b"".join(struct.pack("<I", len(b)) + b for b in (e.encode("utf-8") for e in elements))
        else:
            tensor = {"name": spec.name, "datatype": spec.datatype, "shape": list(arr.shape)}
            if not ask.binary:
                out.append(({**tensor, "data": arr.ravel().tolist()}, b""))
                continue
            if spec.datatype == "BF16":  # the upper halves of the FP32 values
                raw = (np.asarray(arr, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
            else:
                raw = np.asarray(arr).astype(WIRE_DTYPES[spec.datatype]).tobytes()
        out.append(({**tensor, "parameters": {"binary_data_size": len(raw)}}, raw))
    return out
