"""The handler contract: how failsoft runs a model of any format, and what it says about its tensors.

A *handler* owns one loaded model. Whatever library the model needs (``onnxruntime``, a
``torch.export`` program, ``transformers``, a user's own class), the rest of failsoft sees only this
contract, the way Triton's backends or a Ray Serve deployment hide their framework:

* who constructs it: the model repository (and ``failsoft zoo add``, and the profiler), with the path
  of the variant's artefact and the format's options from its ``config.json``; construction reads
  nothing;
* ``load(device)``: once, in the loading thread; reads the artefact onto ``cpu`` or ``cuda[:N]`` and
  returns the model's :class:`Signature` (its named inputs and outputs);
* per batch, in the serving queue's worker thread and never two at once: ``preprocess`` (named numpy
  inputs, the batch along the first dimension, to what the library takes), ``predict`` (the library
  call), ``postprocess`` (to named numpy outputs, the same batch dimension); :meth:`Handler.infer`
  runs the three;
* ``close()``: when the variant is unloaded; drops the weights;
* ``state()`` / ``apply_state(state)`` / ``reset()``: optional, for a model whose answers depend on
  the requests before it (an online learner, a running statistic, an RNN's hidden state). A handler
  that defines ``state()`` and ``apply_state()`` is *stateful* (:func:`is_stateful`): ``zoo add``
  records it, and a HAMS graph node may serve it with a primary and a backup that its state is
  shipped to. Its wrapper (:mod:`~failsoft.zoo.formats.stateful_handler`) then feeds it **one
  request (one row) at a time, in order**, never two calls at once, and takes or swaps the state
  only between two requests, so a handler keeps no lock of its own. ``state()`` returns the state
  as named numpy arrays (numbers or booleans: they travel as safetensors, never pickled; the
  wrapper copies them); ``apply_state(state)`` gets arrays of exactly the names, shapes and dtypes
  its ``state()`` gave after ``load`` (the wrapper refuses any other, naming what differs) and must
  afterwards answer as the copy the state was taken from would: the same request after the same
  state, the same answer (on CPU, float32 code that runs row by row is bit-exact). ``reset()``
  returns to the state after ``load``; without one, the wrapper applies the state it kept then.

Inputs and outputs are declared as :class:`TensorSpec`: a name, a KServe v2 datatype and the shape of
*one request* (the batch dimension left out); ``-1`` marks a variable dimension. The format factory
is :mod:`failsoft.zoo.formats.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from failsoft.errors import ConfigError

Datatype = Literal[
    "FP32", "FP16", "BF16", "FP64", "INT64", "INT32", "INT16", "INT8", "UINT8", "BOOL", "BYTES"
]

# KServe v2 datatype -> the numpy dtype a batch of it is held in (BYTES: Python bytes in an object array;
# BF16 has no numpy dtype: it travels as FP32 and the handler casts it)
NUMPY_DTYPES: dict[str, str] = {
    "FP32": "float32",
    "FP16": "float16",
    "BF16": "float32",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "BOOL": "bool",
    "BYTES": "object",
}


def datatype_of(dtype: Any) -> Datatype:
    """The KServe v2 datatype of a numpy (or torch, by its name) dtype; ValueError if it has none."""
    name = str(dtype).removeprefix("torch.")
    aliases = {"float": "float32", "half": "float16", "bfloat16": "float32", "long": "int64", "int": "int32"}
    name = aliases.get(name, name)
    if name in ("object", "str", "bytes") or name.startswith(("<U", "|S", "<S")):
        return "BYTES"
    for datatype, np_name in NUMPY_DTYPES.items():
        if np_name == name and datatype not in ("BF16", "BYTES"):
            return datatype  # type: ignore[return-value]
    raise ValueError(f"no KServe datatype for dtype {dtype}")


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output: its datatype and the shape of one request (``-1``: variable)."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(d == 0 or d < -1 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: dimensions are positive or -1, got {list(self.shape)}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """True when one request of ``shape`` fits this declaration."""
        return len(shape) == len(self.shape) and all(
            d in (-1, s) for d, s in zip(self.shape, shape, strict=True)
        )

    def describe(self) -> str:
        return f"{self.name} {self.datatype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Signature:
    """What a loaded model takes and answers, and its class names where it is a classifier."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...] = ()  # labels[i] names class i (transformers' id2label, a labels file)

    def __post_init__(self) -> None:
        if not self.inputs or not self.outputs:
            raise ValueError("a model declares at least one input and one output")

    def mismatch(self, other: Signature) -> str | None:
        """Why ``other`` cannot stand in for this model (None when it can): the inputs and outputs
        must agree in number, datatype and shape, position by position (names may differ)."""
        for kind, ours, theirs in (
            ("inputs", self.inputs, other.inputs),
            ("outputs", self.outputs, other.outputs),
        ):
            if len(ours) != len(theirs):
                return f"{len(theirs)} {kind} where the family has {len(ours)}"
            for a, b in zip(ours, theirs, strict=True):
                if a.datatype != b.datatype or a.shape != b.shape:
                    return f"{kind[:-1]} {b.describe()} where the family has {a.describe()}"
        return None


def record_dtype(
    specs: tuple[TensorSpec, ...], rows: Mapping[str, tuple[int, ...]] | None = None
) -> np.dtype:
    """The numpy record dtype that carries one request of several named tensors as one row.

    A model with several inputs (or outputs) travels through the serving queues as a structured
    array of shape ``(N,)``: one field per tensor, holding that tensor's row; the queues batch and
    split it along the first dimension like any batch. ``rows`` gives the shape of a tensor whose
    declaration has variable (``-1``) dimensions; a variable dimension with no shape given is a
    ConfigError naming it."""
    fields = []
    for spec in specs:
        if spec.datatype == "BYTES":
            raise ConfigError(f"tensor {spec.describe()}: a model of several tensors takes no BYTES one yet")
        shape = tuple((rows or {}).get(spec.name, spec.shape))
        if -1 in shape:
            raise ConfigError(f"tensor {spec.describe()} has a variable dimension: give it a fixed shape")
        fields.append((spec.name, np.dtype(NUMPY_DTYPES[spec.datatype]), shape))
    return np.dtype(fields)


def records(arrays: Mapping[str, np.ndarray], specs: tuple[TensorSpec, ...]) -> np.ndarray:
    """Named batches (one row per request) as one structured batch (see :func:`record_dtype`)."""
    first = np.asarray(arrays[specs[0].name])
    shapes = {s.name: tuple(np.asarray(arrays[s.name]).shape[1:]) for s in specs}
    out = np.empty(len(first), dtype=record_dtype(specs, shapes))
    for spec in specs:
        out[spec.name] = arrays[spec.name]
    return out


def fields(batch: np.ndarray) -> dict[str, np.ndarray]:
    """A structured batch's named tensors (views, not copies; made contiguous by the handlers)."""
    return {name: batch[name] for name in batch.dtype.names or ()}


class Handler(ABC):
    """One model of one format, loaded once and then asked batch after batch (see the module doc).

    A user's ``python``-format model is a subclass of this class, named by import path
    (``package.module:Class``); its weights are the variant's ``model.safetensors``.
    """

    def __init__(self, artefact: Path, options: Mapping[str, Any]) -> None:
        self.artefact = artefact
        self.options = dict(options)

    def import_code(self) -> None:  # noqa: B027 (most handlers import everything with their module)
        """Import what :meth:`load` will need, reading no weights: called ahead of a load whose time
        or memory is measured, and by agents before their heartbeats start."""

    @abstractmethod
    def load(self, device: str) -> Signature:
        """Read the artefact onto ``device`` (``cpu``, ``cuda``, ``cuda:N``); the model's signature."""

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> Any:
        """Named batches (first dimension: the batch) to what :meth:`predict` takes."""
        return dict(inputs)

    @abstractmethod
    def predict(self, batch: Any) -> Any:
        """Run the model on one prepared batch."""

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        """What :meth:`predict` returned, as named numpy batches."""
        return dict(raw)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One batch through preprocess, predict and postprocess."""
        return self.postprocess(self.predict(self.preprocess(inputs)))

    def parameters(self) -> int:
        """How many weights the model holds (0 where the format does not say)."""
        return 0

    def close(self) -> None:  # noqa: B027 (a handler with nothing to release keeps the default)
        """Drop the loaded model; the handler answers nothing afterwards."""

    # the optional state of a stateful model (see the module doc; :func:`is_stateful`) ------------
    def state(self) -> Mapping[str, np.ndarray]:
        """The state the model carries between requests, as named numpy arrays (HAMS ships it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state")

    def apply_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the model's state by one :meth:`state` returned (on this or another copy)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state")

    def reset(self) -> None:
        """Back to the state after :meth:`load` (optional: the wrapper applies that state otherwise)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state")


STATE_METHODS = ("state", "apply_state")


def is_stateful(cls: type[Handler]) -> bool:
    """Whether a handler class keeps state: it defines :meth:`Handler.state` and
    :meth:`Handler.apply_state` (one of the two alone is a ConfigError naming the other)."""
    defined = [m for m in STATE_METHODS if defines(cls, m)]
    if len(defined) == 1:
        (missing,) = set(STATE_METHODS) - set(defined)
        raise ConfigError(
            f"handler {cls.__module__}.{cls.__qualname__} defines {defined[0]}() but not {missing}(): "
            "a stateful handler defines both"
        )
    return bool(defined)


def defines(cls: type[Handler], method: str) -> bool:
    """Whether ``cls`` (or a base of its own, not :class:`Handler`) overrides ``method``."""
    return getattr(cls, method, None) is not getattr(Handler, method)
