"""Deterministic training of the digits variants, and accuracy measured on the held-out split.

Each variant is trained from its own seed with Adam and cross-entropy on the fixed training split of
:func:`failsoft.zoo.digits.load_digits_split`, then scored on the 360 held-out images. PyTorch's
deterministic algorithms are switched on for the duration (and restored after), and the shuffling
uses a seeded generator, so the same code on the same machine gives the same weights. Training runs on
one CPU thread, so the float summation order, and the weights, do not depend on the core count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.zoo.digits import DigitsSplit, load_digits_split

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Training:
    """How a digits variant is trained: Adam on the fixed split, fixed seed, fixed epochs."""

    epochs: int = 15
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 0


@contextlib.contextmanager
def deterministic(seed: int, threads: int | None = 1) -> Iterator[None]:
    """Seed torch, force deterministic kernels and (by default) one thread; restored on exit.

    One thread makes float summation order, and so the weights, independent of the core count; for
    models this small it is also faster than two threads on a busy machine.
    """
    import torch

    was, was_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(was_threads)


def train_digits(module: torch.nn.Module, training: Training, split: DigitsSplit | None = None) -> None:
    """Train ``module`` in place on the digits training split (CPU)."""
    import torch
    from torch import nn

    split = split or load_digits_split()
    x = torch.from_numpy(np.array(split.x_train))
    y = torch.from_numpy(np.array(split.y_train))
    gen = torch.Generator().manual_seed(training.seed)
    opt = torch.optim.Adam(module.parameters(), lr=training.lr)
    loss_fn = nn.CrossEntropyLoss()
    module.train()
    for _ in range(training.epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), training.batch_size):
            idx = order[start : start + training.batch_size]
            opt.zero_grad(set_to_none=True)
            loss_fn(module(x[idx]), y[idx]).backward()
            opt.step()
    module.eval()


def measure_accuracy(
    module: torch.nn.Module, split: DigitsSplit | None = None
) -> tuple[float, dict[str, Any]]:
    """Top-1 on the held-out split, and how it was measured."""
    import torch

    split = split or load_digits_split()
    with torch.inference_mode():
        logits = module(torch.from_numpy(np.array(split.x_test)))
    correct = int((logits.argmax(dim=1).numpy() == split.y_test).sum())
    accuracy = correct / len(split.y_test)
    return accuracy, split.describe() | {"correct": correct}
