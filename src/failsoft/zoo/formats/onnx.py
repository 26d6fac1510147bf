"""The ``onnx`` format: an ONNX file run by ``onnxruntime``.

Threads are set explicitly per session (``threads`` option, default 1 intra-op and 1 inter-op): the
runtime's default of one thread per core oversubscribes a host where several agents and models share
the cores, the reason failsoft's torch models run one thread each too. On ``cuda`` the CUDA
execution provider is used when this onnxruntime build has it, else the CPU provider.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.zoo.formats.interface import NUMPY_DTYPES, Datatype, Handler, Signature, TensorSpec

# onnxruntime's element types -> KServe v2 datatypes
_ONNX_TYPES: dict[str, Datatype] = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(double)": "FP64",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int16)": "INT16",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


class OnnxHandler(Handler):
    """An ``onnxruntime.InferenceSession`` over the variant's ``model.onnx``."""

    def __init__(self, artefact: Path, options: Mapping[str, Any]) -> None:
        super().__init__(artefact, options)
        self._session: Any = None
        self._output_names: tuple[str, ...] = ()
        self._input_types: dict[str, str] = {}

    def import_code(self) -> None:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401

    def load(self, device: str) -> Signature:
        import onnxruntime as ort
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(self.options.get("threads", 1))
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self._session = ort.InferenceSession(str(self.artefact), options, providers=_providers(device))
        except (
            ort_errors.InvalidProtobuf,
            ort_errors.InvalidGraph,
            ort_errors.Fail,
            ort_errors.NoSuchFile,
            ort_errors.InvalidArgument,
            ort_errors.NotImplemented,
            ort_errors.RuntimeException,
        ) as exc:
            first = str(exc).strip().splitlines()[0]
            raise CorruptModelError(f"ONNX file {str(self.artefact)!r} does not load: {first}") from exc
        inputs = tuple(_spec(a) for a in self._session.get_inputs())
        outputs = tuple(_spec(a) for a in self._session.get_outputs())
        self._output_names = tuple(o.name for o in outputs)
        self._input_types = {i.name: i.datatype for i in inputs}
        return Signature(inputs, outputs, tuple(self.options.get("labels", ())))

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for name, array in inputs.items():
            datatype = self._input_types.get(name)
            if datatype is None:
                raise ConfigError(
                    f"the ONNX model has no input {name!r} (inputs: {', '.join(self._input_types)})"
                )
            out[name] = np.asarray(array, dtype=_numpy_dtype(datatype))
        return out

    def predict(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._session is None:
            raise ConfigError(f"ONNX model {str(self.artefact)!r} is not loaded")
        return list(self._session.run(list(self._output_names), batch))

    def postprocess(self, raw: list[np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._output_names, raw, strict=True))

    def parameters(self) -> int:
        import onnx

        model = onnx.load(str(self.artefact), load_external_data=False)
        return sum(int(np.prod(t.dims)) for t in model.graph.initializer)

    def close(self) -> None:
        self._session = None


def copy_onnx(source: Path, target: Path) -> None:
    """Copy an ONNX file; one whose tensors live in external data files is saved as a single file."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        graph = onnx.load(str(source), load_external_data=False).graph
    except Exception as exc:  # protobuf's DecodeError and friends: a file that is not ONNX
        raise CorruptModelError(f"{str(source)!r} is not an ONNX model: {type(exc).__name__}: {exc}") from exc
    if not any(uses_external_data(t) for t in graph.initializer):
        shutil.copyfile(source, target)
        return
    try:
        onnx.save_model(onnx.load(str(source)), str(target))
    except (OSError, ValueError) as exc:
        raise CorruptModelError(
            f"{str(source)!r}: its external data cannot be read or kept in one file: {exc}"
        ) from exc


def _providers(device: str) -> list[Any]:
    import onnxruntime as ort

    if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        index = int(device.partition(":")[2] or 0)
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _spec(arg: Any) -> TensorSpec:
    """A session input or output as a TensorSpec; its first (batch) dimension is left out."""
    datatype = _ONNX_TYPES.get(arg.type)
    if datatype is None:
        raise CorruptModelError(f"ONNX tensor {arg.name!r} has type {arg.type}, which failsoft cannot serve")
    dims = [d if isinstance(d, int) and d > 0 else -1 for d in (arg.shape or [])]
    if not dims:
        raise CorruptModelError(f"ONNX tensor {arg.name!r} has no batch dimension")
    return TensorSpec(arg.name, datatype, tuple(dims[1:]))


def _numpy_dtype(datatype: str) -> Any:
    return object if datatype == "BYTES" else NUMPY_DTYPES[datatype]
