"""The decoders: subtraction (ParM sections 3-4, r = 1) and the linear solve for r > 1 (section 7).

``sub`` is the paper's decoder: with one data output missing, it is the parity output minus the k-1
data outputs that arrived, ``F(X_j) ~ F_P(P) - sum_{i != j} F(X_i)``. It is a few vector
subtractions (the paper measures 8 us; section 6.2.5).

``linear`` decodes any r: with the set M of missing data members (|M| <= number of parity outputs
present), the parity outputs say ``F_P(P_p) - sum_{i not in M} G[p, i] F(X_i) = sum_{j in M} G[p, j]
F(X_j)``. The first |M| parity outputs present (by member index) give a square system in the
missing outputs, solved with ``numpy.linalg.solve``; its matrix is a square submatrix of the
totally positive ``G``, so it is never singular. With r = 1 it gives the same answer as ``sub``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from failsoft.errors import ConfigError
from failsoft.policies.coding.interface import Decoder


class SubtractionDecoder(Decoder):
    """The parity output minus the other data outputs (r = 1 only)."""

    name = "sub"

    def __init__(self, k: int, r: int = 1) -> None:
        super().__init__(k, r)
        if self.r != 1:
            raise ConfigError(f"the subtraction decoder decodes r=1 codes; got r={self.r} (use 'linear')")

    def solve(self, available: Mapping[int, np.ndarray], missing: list[int]) -> dict[int, np.ndarray]:
        # One ufunc call per present data output and nothing else: this runs once per decoded
        # query, usually with cold caches (the serving loop does much else between decodes), where
        # each extra Python step or numpy call costs microseconds.
        j = missing[0]
        out: np.ndarray | None = None
        for i in range(self.k):
            if i == j:
                continue
            if out is None:  # a new array: the inputs are kept
                out = np.subtract(available[self.k], available[i], dtype=np.float32)
            else:
                np.subtract(out, available[i], out=out, dtype=np.float32)
        assert out is not None  # k >= 2: at least one data output is present
        return {j: out}


class LinearDecoder(Decoder):
    """Solves the small linear system of the code ``G`` for the missing data outputs (any r)."""

    name = "linear"

    def solve(self, available: Mapping[int, np.ndarray], missing: list[int]) -> dict[int, np.ndarray]:
        parities = sorted(i - self.k for i in available if i >= self.k)[: len(missing)]
        present = [i for i in range(self.k) if i not in missing]
        shape = np.shape(available[self.k + parities[0]])
        rhs = np.stack([np.asarray(available[self.k + p], dtype=np.float64).ravel() for p in parities])
        for i in present:
            rhs -= (
                self.coefficients[parities, i][:, None] * np.asarray(available[i], dtype=np.float64).ravel()
            )
        solved = np.linalg.solve(self.coefficients[np.ix_(parities, missing)], rhs)
        return {j: solved[n].reshape(shape).astype(np.float32) for n, j in enumerate(missing)}
