"""The ``pt2`` format: a ``torch.export`` program (``torch.export.save`` / ``torch.export.load``).

An exported program is a graph with its weights and no Python code of the user's, so it loads without
the model's source. Its inputs and outputs are read from the graph's placeholders and output node:
a dimension the export marked dynamic (``torch.export.Dim``) is ``-1``; the first dimension is the
batch. Export the batch dimension as dynamic, or the program answers only the batch size it was
exported with (``failsoft zoo add`` checks it answers batches of 1 and 2).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.zoo.formats.interface import Handler, Signature, TensorSpec, datatype_of


class ExportedHandler(Handler):
    """The variant's ``model.pt2``, run under ``torch.inference_mode`` on its device."""

    _module: Any = None
    _device = "cpu"
    _inputs: tuple[TensorSpec, ...] = ()
    _outputs: tuple[TensorSpec, ...] = ()

    def import_code(self) -> None:
        import torch
        import torch.export  # noqa: F401
        from torch._export.serde import serialize  # noqa: F401 (what torch.export.load reads with)

    def load(self, device: str) -> Signature:
        import torch

        try:
            program = torch.export.load(str(self.artefact))
        except (RuntimeError, ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CorruptModelError(
                f"torch.export file {str(self.artefact)!r} does not load: {first}"
            ) from exc
        self._inputs, self._outputs = _signature(program)
        self._module = program.module().to(device)
        self._device = device
        return Signature(self._inputs, self._outputs, tuple(self.options.get("labels", ())))

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        import torch

        missing = [t.name for t in self._inputs if t.name not in inputs]
        if missing:
            raise ConfigError(f"the exported program needs input(s) {', '.join(missing)}")
        return [torch.from_numpy(np.ascontiguousarray(inputs[t.name])).to(self._device) for t in self._inputs]

    def predict(self, batch: list[Any]) -> Any:
        import torch

        if self._module is None:
            raise ConfigError(f"exported program {str(self.artefact)!r} is not loaded")
        with torch.inference_mode():
            return self._module(*batch)

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        values = raw if isinstance(raw, (tuple, list)) else (raw,)
        return {
            t.name: v.detach().float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
            for t, v in zip(self._outputs, values, strict=True)
        }

    def parameters(self) -> int:
        if self._module is None:
            return 0
        return sum(p.numel() for p in self._module.parameters())

    def close(self) -> None:
        self._module = None


def _signature(program: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The program's user inputs and outputs, from the fake tensors export recorded on the graph."""
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            inputs.append(_spec(node.name, node.meta.get("val")))
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    names = list(program.graph_signature.user_outputs)
    values = [arg.meta.get("val") for arg in output_node.args[0]][-len(names) :] if names else []
    outputs = [_spec(name, val) for name, val in zip(names, values, strict=True)]
    if not inputs or not outputs:
        raise CorruptModelError("the exported program declares no tensor input or output")
    return tuple(inputs), tuple(outputs)


def _spec(name: str, fake: Any) -> TensorSpec:
    if fake is None or not hasattr(fake, "shape"):
        raise CorruptModelError(f"exported tensor {name!r} is not a tensor")
    dims = [d if isinstance(d, int) else -1 for d in fake.shape]
    if not dims:
        raise CorruptModelError(f"exported tensor {name!r} has no batch dimension")
    return TensorSpec(name, datatype_of(fake.dtype), tuple(dims[1:]))
