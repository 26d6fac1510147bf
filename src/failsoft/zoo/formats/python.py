"""The ``python`` format: a user's handler class and its weights in safetensors.

For a model that needs its own code or its own pre- and post-processing (Triton's Python backend, a
Ray Serve deployment class, a BentoML service), write a subclass of
:class:`~failsoft.zoo.formats.interface.Handler` and add it with ``failsoft zoo add FAMILY/VARIANT
model.safetensors --format python --handler package.module:Class``. The handler's ``artefact`` is the
variant's ``model.safetensors``; :func:`load_safetensors` reads it onto the device as torch tensors,
:func:`load_arrays` as numpy arrays (for a handler in plain numpy), never unpickling.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from failsoft.errors import CorruptModelError

if TYPE_CHECKING:
    import torch


def load_safetensors(path: Path, device: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file on ``device``; CorruptModelError naming the file otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptModelError(f"weight file {str(path)!r} cannot be read: {exc}") from exc


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file as numpy; CorruptModelError naming the file otherwise."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptModelError(f"weight file {str(path)!r} cannot be read: {exc}") from exc
