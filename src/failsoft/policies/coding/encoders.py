"""The two encoders of ParM: the addition encoder (sections 3-4) and image concatenation (5.2.3).

``add`` (k in 2..4): parity query ``p`` is the element-wise weighted sum ``sum_i G[p, i] X_i`` of the
k queries (for r = 1 simply ``X_1 + ... + X_k``, "summation is performed across corresponding
features of each query", section 4.2). It works for any input shape.

``concat`` (k of 2 or 4): an encoder specialised to images (section 5.2.3, Fig. 9). Each of the k
images is downsampled and the k small images are tiled into one image of the original shape, so the
parity model (the deployed architecture) takes it as it is:

* k = 2: each image is halved in width (H x W/2) and the two are placed side by side, ``0 | 1``;
* k = 4: each image is halved in both sides (H/2 x W/2) and placed in quadrants, ``0 1 / 2 3``.

Downsampling by 2 is the mean of each pair (k = 2) or 2 x 2 block (k = 4) of pixels: area
interpolation, which is what a bilinear resize with anti-aliasing does at an exact factor of 2 (the
public code resizes with torchvision's ``Resize``). An input of shape ``(n,)`` is read as a square
``sqrt(n) x sqrt(n)`` image (the digits' 64-vector is their 8 x 8 image), ``(H, W)`` as one channel
and ``(C, H, W)`` channel by channel; the sides to be halved must be even. With r > 1, tile ``i`` of
parity query ``p`` is scaled by ``G[p, i]`` (see :mod:`failsoft.policies.coding.interface`).
"""

from __future__ import annotations

import math

import numpy as np

from failsoft.errors import ConfigError
from failsoft.policies.coding.interface import Encoder


class AddEncoder(Encoder):
    """``P_p = sum_i G[p, i] X_i``, element-wise (r = 1: the plain sum of the k queries)."""

    name = "add"

    def _combine(self, queries: list[np.ndarray], weights: tuple[float, ...]) -> np.ndarray:
        if weights[0] == weights[1] == 1.0:  # r = 1 (and row 0): one new array, then in place
            out = np.add(queries[0], queries[1], dtype=np.float32)
            rest = zip(queries[2:], weights[2:], strict=True)
        else:
            out = np.multiply(queries[0], np.float32(weights[0]), dtype=np.float32)
            rest = zip(queries[1:], weights[1:], strict=True)
        for q, w in rest:
            np.add(out, q if w == 1.0 else np.float32(w) * q, out=out, dtype=np.float32)
        return out


class ConcatEncoder(Encoder):
    """k images downsampled and tiled into one image of the same shape (k of 2 or 4)."""

    name = "concat"

    def __init__(self, k: int, r: int = 1, input_shape: tuple[int, ...] = (64,)) -> None:
        super().__init__(k, r, input_shape)
        if self.k not in (2, 4):
            raise ConfigError(f"the concat encoder takes k of 2 or 4 (the paper's layouts); got k={self.k}")
        self.image_shape = _image_shape(self.input_shape)
        _, h, w = self.image_shape
        if w % 2 or (self.k == 4 and h % 2):
            halved = "width" if self.k == 2 else "height and width"
            raise ConfigError(
                f"the concat encoder with k={self.k} halves the image {halved}; {h}x{w} is not even there"
            )

    def _combine(self, queries: list[np.ndarray], weights: tuple[float, ...]) -> np.ndarray:
        n = len(self.input_shape)
        batch = queries[0].shape[:-n]  # () or (N,)
        c, h, w = self.image_shape
        out = np.empty((*batch, c, h, w), dtype=np.float32)
        for i in range(self.k):
            image = np.asarray(queries[i], dtype=np.float32).reshape((*batch, c, h, w))
            small = _halve(image, both=self.k == 4)
            if weights[i] != 1.0:
                small *= np.float32(weights[i])
            rows, cols = small.shape[-2:]
            top, left = (i // 2) * rows, (i % 2) * cols
            out[..., top : top + rows, left : left + cols] = small
        return out.reshape((*batch, *self.input_shape))


def _image_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(C, H, W)`` of one query: a square vector, an ``H x W`` image or a ``C x H x W`` one."""
    if len(shape) == 1:
        side = math.isqrt(shape[0])
        if side * side != shape[0]:
            raise ConfigError(
                f"the concat encoder reads a vector input as a square image; {shape[0]} is not square"
            )
        return (1, side, side)
    if len(shape) == 2:
        return (1, shape[0], shape[1])
    if len(shape) == 3:
        return (shape[0], shape[1], shape[2])
    raise ConfigError(f"the concat encoder takes images (n,), (H, W) or (C, H, W); got shape {shape}")


def _halve(images: np.ndarray, both: bool) -> np.ndarray:
    """Area downsampling by 2 of the width (and the height when ``both``) of ``(..., H, W)``."""
    half = images[..., 0::2] + images[..., 1::2]
    if both:
        return (half[..., 0::2, :] + half[..., 1::2, :]) * np.float32(0.25)
    return half * np.float32(0.5)
