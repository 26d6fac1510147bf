"""The on-disk layout of a model repository, and the ``config.json`` every variant carries.

Like a Triton model repository, a failsoft repository is a directory of directories::

    <root>/<family>/<variant>/model.safetensors   weights (safetensors only: never pickle), or the
                                                  artefact of a user's model (``model.onnx``,
                                                  ``model.pt2``, ``model/`` for a transformers dir)
    <root>/<family>/<variant>/config.json         architecture, input/output shape, accuracy, weight hash,
                                                  and ``stateful`` (the model keeps state across requests)
    <root>/<family>/<variant>/profile.json        what the profiler measured on this machine

``model_format`` says which library loads the variant (:mod:`failsoft.zoo.formats`): ``builtin`` for
the zoo's own architectures (``arch``), or ``onnx``, ``pt2``, ``hf``, ``python`` for a user's model
added with ``failsoft zoo add``, whose declared ``inputs`` and ``outputs`` the config carries.

``config.json`` is written when the variant is built (trained or initialised) and is enough to rebuild
the network exactly; ``profile.json`` is written by the profiler and feeds the planners (FailLite
section 3.2 needs each variant's memory, load time, latency and accuracy).

Names of families and variants are single path components of letters, digits, ``_``, ``-`` and
``.`` that do not start with a dot, so a name can never reach outside the repository.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from failsoft.bounds import describe_validation_error
from failsoft.errors import CorruptModelError, ModelNotFoundError
from failsoft.zoo.formats.interface import Datatype, TensorSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROFILE_FILE = "profile.json"
FORMAT_VERSION = 1
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# "user": a model added with ``failsoft zoo add``, loaded by its ``model_format``'s library
Arch = Literal["digits_mlp", "digits_cnn", "transformers", "sp500_gru", "digits_online", "user"]
ModelFormat = Literal["builtin", "onnx", "pt2", "hf", "python"]
# architectures whose models keep state across requests (:mod:`failsoft.zoo.stateful`)
STATEFUL_ARCHES: frozenset[str] = frozenset({"sp500_gru", "digits_online"})


def check_name(kind: str, name: object) -> str:
    """``name`` if it is a safe single path component, else :class:`ModelNotFoundError`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or ".." in name:
        raise ModelNotFoundError(
            f"invalid {kind} name {name!r}: names are letters, digits, '_', '-' and '.', "
            "not starting with '.', and never a path"
        )
    return name


class _AccuracySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float = Field(ge=0, le=1)
    source: Literal["measured", "declared"]
    detail: dict[str, Any] = Field(default_factory=dict)


class _WeightsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str = Field(default=WEIGHTS_FILE, pattern=NAME_PATTERN.pattern)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern="^[0-9a-f]{64}$")


class _TensorModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=128)
    datatype: Datatype
    shape: tuple[int, ...]

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, self.shape)


class _ConfigSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    format: int = Field(ge=1, le=FORMAT_VERSION)
    family: str
    variant: str
    arch: Arch
    architecture: dict[str, Any]
    input_shape: tuple[int, ...]  # () for a model of several inputs (one structured row per request)
    num_classes: int = Field(gt=0)
    parameters: int = Field(ge=0)
    weights: _WeightsSpec
    accuracy: _AccuracySpec
    stateful: bool = False
    model_format: ModelFormat = "builtin"
    handler: dict[str, Any] = Field(default_factory=dict)
    inputs: tuple[_TensorModel, ...] = ()
    outputs: tuple[_TensorModel, ...] = ()
    labels: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _shape_or_several_inputs(self) -> _ConfigSpec:
        if not self.input_shape and len(self.inputs) < 2:
            raise ValueError("input_shape is empty, which only a model of several inputs may have")
        return self


@dataclass(frozen=True)
class Accuracy:
    """Top-1 in [0, 1]: ``measured`` on a held-out split here, or ``declared`` (published)."""

    value: float
    source: Literal["measured", "declared"]
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VariantConfig:
    """What ``config.json`` says about one variant: enough to rebuild and check it."""

    family: str
    variant: str
    arch: Arch
    architecture: dict[str, Any]
    input_shape: tuple[int, ...]
    num_classes: int
    parameters: int
    weights_bytes: int
    weights_sha256: str
    accuracy: Accuracy
    stateful: bool = False  # compute() changes the model; it exposes state() and apply_state()
    model_format: ModelFormat = "builtin"
    handler: dict[str, Any] = field(default_factory=dict)  # the format's options (task, class, ...)
    inputs: tuple[TensorSpec, ...] = ()  # declared by a user's model; () for the built-in ones
    outputs: tuple[TensorSpec, ...] = ()
    weights_file: str = WEIGHTS_FILE  # the artefact, relative to the variant directory
    labels: tuple[str, ...] = ()  # labels[i] names class i (a user's model's id2label or labels file)

    def to_dict(self) -> dict[str, Any]:
        user = {
            "model_format": self.model_format,
            "handler": self.handler,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "labels": list(self.labels),
        }
        return self._builtin_dict() | (user if self.model_format != "builtin" else {})

    def _builtin_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "family": self.family,
            "variant": self.variant,
            "arch": self.arch,
            "architecture": self.architecture,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "parameters": self.parameters,
            "weights": {
                "file": self.weights_file,
                "bytes": self.weights_bytes,
                "sha256": self.weights_sha256,
            },
            "accuracy": {
                "value": self.accuracy.value,
                "source": self.accuracy.source,
                "detail": self.accuracy.detail,
            },
            "stateful": self.stateful,
        }


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; a missing file is :class:`ModelNotFoundError`, a bad one corrupt."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"missing file {str(path)!r}") from exc
    except OSError as exc:
        raise CorruptModelError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptModelError(f"{str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, dict):
        raise CorruptModelError(f"{str(path)!r} does not hold a JSON object")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` next to ``path`` and rename it into place, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def read_config(variant_dir: Path) -> VariantConfig:
    path = variant_dir / CONFIG_FILE
    data = read_json(path)
    try:
        spec = _ConfigSpec.model_validate(data)
    except ValidationError as exc:
        raise CorruptModelError(f"{str(path)!r}: {describe_validation_error(exc, data)}") from exc
    return VariantConfig(
        family=spec.family,
        variant=spec.variant,
        arch=spec.arch,
        architecture=dict(spec.architecture),
        input_shape=tuple(spec.input_shape),
        num_classes=spec.num_classes,
        parameters=spec.parameters,
        weights_bytes=spec.weights.bytes,
        weights_sha256=spec.weights.sha256,
        accuracy=Accuracy(spec.accuracy.value, spec.accuracy.source, dict(spec.accuracy.detail)),
        stateful=spec.stateful,
        model_format=spec.model_format,
        handler=dict(spec.handler),
        inputs=tuple(t.spec() for t in spec.inputs),
        outputs=tuple(t.spec() for t in spec.outputs),
        weights_file=spec.weights.file,
        labels=tuple(spec.labels),
    )
