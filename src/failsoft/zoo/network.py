"""From a variant's config to a runnable network, and its weights to and from safetensors.

This is the one place that turns stored bytes into a ``torch.nn.Module``. Weights are read with
``safetensors`` only (a format with no code in it: loading a weight file can never run anything), and
every failure to read them back becomes a :class:`~failsoft.errors.CorruptModelError` naming the file.

The module is built on PyTorch's ``meta`` device and the tensors are *assigned* to it, so loading a
variant costs reading its weights once, straight onto the target device, and nothing else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from failsoft.errors import CorruptModelError, ModelNotFoundError
from failsoft.zoo.layout import VariantConfig
from failsoft.zoo.loaded import Forward

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A module built on ``meta`` from ``config``, and its logits function: built ahead of a load by
    :mod:`failsoft.zoo.skeletons`, consumed by :func:`load_network`."""

    config: VariantConfig
    module: torch.nn.Module
    forward: Forward


def build_network(config: VariantConfig, on_meta: bool = False) -> tuple[torch.nn.Module, Forward]:
    """The module a config describes (random init, or empty on ``meta``) and its logits function."""
    if config.arch == "transformers":
        from failsoft.zoo import hf

        module = hf.model_from_config(config.architecture, on_meta=on_meta)
        return module, lambda x: hf.forward_logits(module, x)
    from failsoft.zoo.digits import build_digits_module
    from failsoft.zoo.stateful import build_stateful_module, is_stateful_arch

    build = build_stateful_module if is_stateful_arch(config.arch) else build_digits_module
    if on_meta:
        import torch

        with torch.device("meta"):
            module = build(config.arch, config.architecture)
    else:
        module = build(config.arch, config.architecture)
    return module, module


def import_code(config: VariantConfig) -> None:
    """Import everything loading a config needs, ahead of time (memory probes must not count imports).

    Building the network once on the ``meta`` device runs its construction code (and the lazy imports
    in it) without allocating any weights.
    """
    import safetensors.torch  # noqa: F401

    if config.arch == "transformers":
        from failsoft.zoo import hf

        hf.import_model_class(config.architecture)
    build_network(config, on_meta=True)


def save_weights(module: torch.nn.Module, path: Path) -> tuple[int, str]:
    """Write the module's state as safetensors; returns (bytes, sha256) of the file."""
    from safetensors.torch import save_file

    state = {name: t.detach().contiguous().cpu() for name, t in module.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    return path.stat().st_size, file_sha256(path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_network(
    variant_dir: Path, config: VariantConfig, device: str, skeleton: Skeleton | None = None
) -> tuple[torch.nn.Module, Forward]:
    """Rebuild the variant and assign its weights on ``device``, in eval mode.

    Three phases, each timed on its own by ``failsoft bench load``: :func:`read_weights` (on the CPU
    the tensors are views of the file's pages: nothing is copied), the module skeleton on ``meta``
    (no allocation; ``skeleton`` when one was prepared ahead and built from this very config:
    :mod:`failsoft.zoo.skeletons`), and :func:`assign_weights` (the skeleton takes the tensors as
    they are: it is consumed).
    """
    state = read_weights(weights_path(variant_dir), device)
    if skeleton is not None and skeleton.config == config:
        module, forward = skeleton.module, skeleton.forward
    else:
        module, forward = build_network(config, on_meta=True)
    return assign_weights(module, state, weights_path(variant_dir)), forward


def weights_path(variant_dir: Path) -> Path:
    """The variant's safetensors file; ModelNotFoundError when it is missing."""
    from failsoft.zoo.layout import WEIGHTS_FILE

    path = variant_dir / WEIGHTS_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"weight file {str(path)!r} is missing")
    return path


def assign_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> torch.nn.Module:
    """``module`` (a ``meta`` skeleton) holding ``state``'s tensors themselves, in eval mode."""
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except (RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise CorruptModelError(f"weight file {str(path)!r} does not fit its config.json: {first}") from exc
    return module.eval()


def read_weights(path: Path, device: str) -> dict[str, torch.Tensor]:
    """The file's tensors on ``device``.

    safetensors (0.4 and later) maps the file and, on the CPU, hands out tensors over the mapped
    pages: the read costs the header and the page-table work, and the bytes are touched first by
    the first answer (from the page cache, or the disk when cold). On a GPU the bytes are copied
    once, host to device.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptModelError(f"weight file {str(path)!r} cannot be read back: {exc}") from exc
