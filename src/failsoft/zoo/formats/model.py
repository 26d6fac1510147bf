"""A user's model loaded through its handler, as the :class:`LoadedModel` the runtime serves.

The runtime holds every model as a :class:`~failsoft.zoo.loaded.LoadedModel`: ``predict`` takes a
batch of the model's first input and returns its first output, which is what the serving queues batch
and the gateway's protocol carries today. :class:`HandlerModel` gives a handler that face, and
:meth:`HandlerModel.infer` the whole contract (every named input and output).

A variant may keep a sample of its inputs (``sample.npy``, written by ``failsoft zoo add``): the
profiler measures the model on it rather than on random values, which a tokenizer or an image
decoder would not take.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.zoo.formats.images import PROCESSOR_FILE, ImageInput, image_input
from failsoft.zoo.formats.interface import (
    NUMPY_DTYPES,
    Handler,
    Signature,
    TensorSpec,
    record_dtype,
    records,
)
from failsoft.zoo.formats.registry import open_handler
from failsoft.zoo.layout import VariantConfig, read_json
from failsoft.zoo.loaded import LoadedModel

SAMPLE_FILE = "sample.npy"


class HandlerModel(LoadedModel):
    """A loaded handler. ``predict`` is its first input to its first output (as float32)."""

    def __init__(
        self,
        config: VariantConfig,
        device: str,
        handler: Handler,
        signature: Signature,
        sample: np.ndarray | None = None,
    ) -> None:
        super().__init__(
            config.family,
            config.variant,
            device,
            config.input_shape,
            config.num_classes,
            handler,  # type: ignore[arg-type]  # the handler stands where a torch module would
            handler.infer,  # type: ignore[arg-type]
        )
        self.handler = handler
        self.signature = signature
        self._sample = sample
        self.declared_inputs = config.inputs or signature.inputs  # variable dimensions pinned by zoo add

    @property
    def primary_input(self) -> TensorSpec:
        return self.signature.inputs[0]

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """The served face: the first input to the first output (float32); a model with several
        inputs takes a structured batch (one field per input; a plain batch of ``(N,)`` is the
        agents' warm-up, served as zeros in every input), and a model with several outputs answers
        one (one field per output: :func:`~failsoft.zoo.formats.interface.records`)."""
        inputs = self.signature.inputs
        if len(inputs) > 1:
            arr = np.asarray(batch)
            if arr.dtype.names is None:  # warm-up: zero data, Triton's zero_data
                self._check_shape(arr)
                arr = np.zeros(len(arr), dtype=record_dtype(self.declared_inputs))
            names = arr.dtype.names or ()
            if len(names) != len(inputs):
                raise ConfigError(f"{self.family}/{self.variant} takes {len(inputs)} inputs, got {arr.dtype}")
            # by position: a family's variants may name their tensors differently
            named = {s.name: _cast(np.asarray(arr[f]), s) for s, f in zip(inputs, names, strict=True)}
        else:
            spec = self.primary_input
            arr = np.asarray(batch, dtype=object if spec.datatype == "BYTES" else None)
            self._check_shape(arr)
            named = {spec.name: _cast(arr, spec)}
        out = self.infer(named)
        outputs = self.signature.outputs
        if len(outputs) > 1:
            return records({o.name: _as_declared(out[o.name], o) for o in outputs}, outputs)
        return np.asarray(out[outputs[0].name], dtype=np.float32)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Named input batches to named output batches, through the whole handler contract."""
        if self.closed:
            raise ConfigError(f"model {self.family}/{self.variant} is closed")
        return self.handler.infer(inputs)

    def example_batch(self, batch_size: int) -> np.ndarray:
        """The user's sample inputs, repeated to ``batch_size`` rows (random ones where none was kept)."""
        if self._sample is None:
            return super().example_batch(batch_size)
        reps = -(-batch_size // len(self._sample))
        return np.concatenate([self._sample] * reps)[:batch_size]

    def __enter__(self) -> HandlerModel:
        return self

    def close(self) -> None:
        if not self.closed:
            self.handler.close()
        super().close()


def _as_declared(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    return np.asarray(arr, dtype=object if spec.datatype == "BYTES" else NUMPY_DTYPES[spec.datatype])


def _cast(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    if spec.datatype == "BYTES":
        return arr
    if arr.dtype.kind not in "fiub":
        raise ConfigError(f"input {spec.name!r} takes {spec.datatype}, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=NUMPY_DTYPES[spec.datatype])


def read_sample(variant_dir: Path) -> np.ndarray | None:
    """The inputs kept by ``zoo add`` (``sample.npy``; object arrays are refused: no pickle)."""
    path = variant_dir / SAMPLE_FILE
    if not path.is_file():
        return None
    try:
        sample = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise CorruptModelError(f"{str(path)!r} cannot be read without pickle: {exc}") from exc
    # BYTES samples are kept as fixed-width bytes ('S'), which need no pickle; served as Python bytes
    return sample.astype(object) if sample.dtype.kind == "S" else sample


def import_code(variant_dir: Path, config: VariantConfig) -> None:
    """Import a user's variant's handler and libraries ahead of loading (memory probes, heartbeats)."""
    open_handler(config.model_format, variant_dir / config.weights_file, config.handler).import_code()


def image_input_of(variant_dir: Path, config: VariantConfig) -> ImageInput | None:
    """How a variant takes encoded images: an ``hf`` image classifier through its directory's image
    processor, any other user's variant through the ``preprocessor_config.json`` kept beside it
    (``zoo add --image-processor``); None for a model that takes no images."""
    if config.model_format == "builtin" or not config.inputs or config.inputs[0].datatype != "FP32":
        return None
    if config.model_format == "hf":
        if config.inputs[0].name != "pixel_values":
            return None
        return image_input(config.inputs[0].shape, variant_dir / config.weights_file)
    if not (variant_dir / PROCESSOR_FILE).is_file():
        return None
    return image_input(config.inputs[0].shape, variant_dir)


def family_image_input(family: str, inputs: Mapping[str, ImageInput | None]) -> ImageInput | None:
    """The family's way to take images (variant -> its own, None where it takes none); variants that
    take images must prepare them alike (a failover must not change what a pixel means)."""
    taking = {v: i for v, i in inputs.items() if i is not None}
    if not taking:
        return None
    prepared = {v: (i.shape, _processor_config(i.processor_dir)) for v, i in taking.items()}
    if len(set(prepared.values())) > 1:
        ways = ", ".join(f"{v}: {list(p[0])} {p[1] or 'resize only'}" for v, p in prepared.items())
        raise ConfigError(f"family {family!r}: its variants prepare images differently ({ways})")
    with_processor = [i for i in taking.values() if i.processor_dir is not None]
    return (with_processor or list(taking.values()))[0]


def _processor_config(directory: str | None) -> str:
    if directory is None:
        return ""
    return json.dumps(read_json(Path(directory) / PROCESSOR_FILE), sort_keys=True)
