"""What the gateway's request parsing and the named-tensor layer share: an app's model metadata,
the wire datatypes, top-K classification, and how an error quotes a value (kept apart from
:mod:`.protocol` and :mod:`.named`, which both use them, so that neither imports the other back)."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from failsoft.zoo.formats.images import ImageInput
from failsoft.zoo.formats.interface import TensorSpec

# the numeric KServe datatypes an input may be sent in, and their little-endian wire dtype
WIRE_DTYPES: dict[str, str] = {
    "FP32": "<f4", "FP16": "<f2", "BF16": "<u2", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4",
    "INT16": "<i2", "INT8": "i1", "UINT8": "u1", "BOOL": "?",
}  # fmt: skip
_REPR = reprlib.Repr()  # Python 3.11's takes no arguments
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 6, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What the gateway must know of an app's family to validate requests (all variants share it)."""

    input_shape: tuple[int, ...]
    num_classes: int
    labels: tuple[str, ...] = ()  # labels[i] names class i; () when the models have none
    input_datatype: str = "FP32"  # BYTES: the models take texts (UTF-8), one per row
    image: ImageInput | None = None  # the FP32 pixel input may also be sent as PNG/JPEG BYTES
    inputs: tuple[TensorSpec, ...] = ()  # a user's model's named tensors (:mod:`.named` serves them
    outputs: tuple[TensorSpec, ...] = ()  # when there are several); () for the built-in families

    @property
    def named(self) -> bool:
        """Whether requests name several inputs or outputs (see :mod:`failsoft.runtime.gateway.named`)."""
        return len(self.inputs) > 1 or len(self.outputs) > 1


def show(value: Any) -> str:
    """A value as an error message may quote it: short, and safe for any nesting depth."""
    return _REPR.repr(value)


def classify(logits: np.ndarray, k: int, labels: tuple[str, ...] = ()) -> list[list[str]]:
    """Per row, the ``k`` highest-scoring classes as Triton writes them: ``"score:index"``, or
    ``"score:index:label"`` with labels; best first (ties: the lower index first)."""
    rows = np.atleast_2d(np.asarray(logits, dtype=np.float32))
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    name = (lambda i: f":{labels[i]}") if labels else (lambda i: "")
    return [[f"{row[i]:f}:{i}{name(i)}" for i in top] for row, top in zip(rows, order, strict=True)]
