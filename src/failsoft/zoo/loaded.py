"""A variant loaded in memory and ready to answer: what an agent holds for a warm or active model.

:class:`LoadedModel` is the runtime's only handle on a network. It takes a float32 batch as numpy,
runs it under ``torch.inference_mode`` on the device the model was loaded on, and returns float32
logits. ``close()`` drops the weights (and returns cached CUDA blocks), which is what unloading a
warm backup means in FailLite (section 3.3: warm backups are released to make room for a failover).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.errors import ConfigError

if TYPE_CHECKING:
    import torch

Forward = Callable[["torch.Tensor"], "torch.Tensor"]  # a network's logits function


class LoadedModel:
    """One loaded variant. Not thread-safe for ``close()`` racing ``predict()``; one owner at a time.

    ``input_shape`` is the shape of one request without the batch dimension (``(64,)`` for the digits
    families, ``(3, H, W)`` for the ImageNet ones); ``predict`` returns ``(N, num_classes)`` logits.
    """

    def __init__(
        self,
        family: str,
        variant: str,
        device: str,
        input_shape: tuple[int, ...],
        num_classes: int,
        module: torch.nn.Module,
        forward: Forward,
    ) -> None:
        self.family = family
        self.variant = variant
        self.device = device
        self.input_shape = input_shape
        self.num_classes = num_classes
        self._module: Any = module
        self._forward: Any = forward

    @property
    def closed(self) -> bool:
        return self._module is None

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """Logits for a batch of shape ``(N, *input_shape)``; bad input is a :class:`ConfigError`."""
        import torch

        if self._module is None:
            raise ConfigError(f"model {self.family}/{self.variant} is closed")
        x = self._check(batch)
        with torch.inference_mode():
            out = self._forward(torch.from_numpy(x).to(self.device, non_blocking=False))
        return out.float().cpu().numpy()

    def _check(self, batch: np.ndarray) -> np.ndarray:
        arr = np.asarray(batch)
        if arr.dtype.kind not in "fiu":
            raise ConfigError(f"expected a float32 batch, got dtype {arr.dtype}")
        self._check_shape(arr)
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _check_shape(self, arr: np.ndarray) -> None:
        """A non-empty batch of ``input_shape`` rows, else a ConfigError naming both shapes."""
        if arr.ndim != len(self.input_shape) + 1 or tuple(arr.shape[1:]) != self.input_shape:
            raise ConfigError(
                f"{self.family}/{self.variant} expects a batch of shape (N, "
                f"{', '.join(map(str, self.input_shape))}), got {tuple(arr.shape)}"
            )
        if arr.shape[0] == 0:
            raise ConfigError("empty batch")

    def example_batch(self, batch_size: int) -> np.ndarray:
        """A batch this model accepts, for profiling: seeded uniform values in [0, 1)."""
        return np.random.default_rng(0).random((batch_size, *self.input_shape), dtype=np.float32)

    def close(self) -> None:
        """Release the weights; later calls to ``predict`` are refused. Safe to call twice."""
        if self._module is None:
            return
        self._module = None
        self._forward = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.device
        return f"LoadedModel({self.family}/{self.variant}, {state})"
