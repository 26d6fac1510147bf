"""The digits task: scikit-learn's 8x8 handwritten digits, and the two small families trained on it.

FailLite trades accuracy for size between *variants of one family* (section 2.4, Fig. 2). The
ImageNet families of the zoo carry published accuracies; these two families are trained here, so their
accuracy is *measured* on a held-out split, and they are small enough to train, serve and test on two
CPU cores in seconds.

Every digits model takes the same input: a float32 vector of the 64 pixel values scaled to [0, 1]
(shape ``(64,)``), so any client request works on any digits app. The CNN reshapes it to ``1x8x8``
internally. The output is a vector of 10 logits.

The split is fixed: 20 % of the 1797 images, stratified by class, with ``random_state=0`` (360 test
images, 1437 training images). :func:`load_digits_split` is the one place that defines it; the parity
models of ParM and the demo's client requests use the same split.

Architectures are plain ``torch.nn`` modules built from a small JSON-able description (the
``architecture`` block of a variant's ``config.json``), so a variant is rebuilt exactly from its
config before its safetensors weights are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

DIGITS_INPUT_SHAPE = (64,)
DIGITS_CLASSES = 10
SPLIT_SEED = 0
TEST_FRACTION = 0.2


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed train/test split of scikit-learn's digits, pixels scaled to [0, 1] as float32."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": "sklearn.datasets.load_digits",
            "test_fraction": TEST_FRACTION,
            "split_seed": SPLIT_SEED,
            "stratified": True,
            "n_train": len(self.y_train),
            "n_test": len(self.y_test),
        }


@lru_cache(maxsize=1)
def load_digits_split() -> DigitsSplit:
    """The fixed held-out split every digits model is trained and measured on (cached, read-only)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y
    )
    for arr in (x_tr, x_te, y_tr, y_te):
        arr.setflags(write=False)
    return DigitsSplit(x_tr, y_tr, x_te, y_te)


def build_digits_module(arch: str, architecture: dict[str, Any]) -> torch.nn.Module:
    """The module a digits ``config.json`` describes (``arch`` is ``digits_mlp`` or ``digits_cnn``)."""
    if arch == "digits_mlp":
        return _mlp(list(architecture["hidden"]))
    if arch == "digits_cnn":
        return _cnn(list(architecture["channels"]), int(architecture["fc"]))
    raise KeyError(f"unknown digits architecture {arch!r}")


def _mlp(hidden: list[int]) -> torch.nn.Module:
    from torch import nn

    layers: list[nn.Module] = []
    width = DIGITS_INPUT_SHAPE[0]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, DIGITS_CLASSES))
    return nn.Sequential(*layers)


def _cnn(channels: list[int], fc: int) -> torch.nn.Module:
    """Conv blocks on the 1x8x8 image; a 2x2 max-pool after every second conv (8x8 -> 4x4 -> 2x2)."""
    from torch import nn

    layers: list[nn.Module] = [nn.Unflatten(1, (1, 8, 8))]
    in_ch, side = 1, 8
    for i, out_ch in enumerate(channels):
        layers += [nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1), nn.ReLU()]
        if (i % 2 == 1 or i == len(channels) - 1) and side > 2:
            layers.append(nn.MaxPool2d(2))
            side //= 2
        in_ch = out_ch
    layers.append(nn.Flatten())
    flat = in_ch * side * side
    if fc > 0:
        layers += [nn.Linear(flat, fc), nn.ReLU(), nn.Linear(fc, DIGITS_CLASSES)]
    else:
        layers.append(nn.Linear(flat, DIGITS_CLASSES))
    return nn.Sequential(*layers)
