"""The serving benchmark's in-process limit, without a cluster: a model whose weights outgrow the
caches (a numpy matrix of 8 MB) is timed hot (called back to back) and cold (after a sweep)."""

from __future__ import annotations

import numpy as np

from failsoft.bench.serving import inprocess


class Matrix:
    """A memory-bound "model": one matrix-vector product over 8 MB of float32 weights."""

    input_shape = (2048,)

    def __init__(self) -> None:
        self.weights = np.random.default_rng(0).random((1024, 2048), dtype=np.float32)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return batch @ self.weights.T


def test_the_limit_is_timed_hot_and_after_the_caches_were_swept() -> None:
    out = inprocess(Matrix(), 0.1)
    assert out["requests"] > 0 and out["p50_ms"] > 0
    assert out["cold_p50_ms"] > 0
