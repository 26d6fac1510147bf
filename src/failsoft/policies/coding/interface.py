"""The coding seam: how k queries become r parity queries, and how missing outputs come back.

ParM (section 3) protects k queries sent to k instances of a deployed model F with r *parity
queries* sent to r instances of *parity models*. Member indices are fixed for a coding group:
``0 .. k-1`` are the data members (the k queries, in arrival order), ``k .. k+r-1`` the parity
members. Two pure objects make the code:

* an :class:`Encoder` turns the k query arrays into r parity query arrays of the same shape
  (:meth:`Encoder.encode`), and says what parity model ``p`` is trained to output: the weighted sum
  ``sum_i G[p, i] F(X_i)`` of the deployed outputs (:meth:`Encoder.parity_target`);
* a :class:`Decoder` takes the outputs that arrived, as a mapping from member index to output, and
  returns the missing *data* outputs once any k of the k+r are present (:meth:`Decoder.decode`),
  else ``None``.

The k x r code is *linear on the outputs* with the coefficient matrix ``G = code_matrix(k, r)``:
``G[p, i] = (i + 1) ** p``, a Vandermonde matrix on the distinct positive nodes 1..k. Its first row
is all ones, so r = 1 is exactly the paper's addition code (sections 3-4: the parity model learns
``F(X_1) + ... + F(X_k)`` and the decoder subtracts), and its second row is the paper's own r = 2
example (section 7: ``F(X_1) + 2 F(X_2)``). A Vandermonde matrix on positive increasing nodes is
totally positive: every square submatrix has a positive determinant, so whichever s <= r data
outputs are missing, any s of the parity outputs determine them (the code is MDS: any k of the k+r
answers suffice).

**Why the parity queries differ for r > 1.** The paper's section 7 sends the same parity query
``X_1 + X_2`` to both parity models and trains the second to output ``F(X_1) + 2 F(X_2)``. But that
query is symmetric in ``X_1`` and ``X_2``, so no model can tell which term to double: the best it
can learn is the symmetric average. failsoft therefore weights the *queries* with the same
coefficients as the outputs: parity query ``p`` is ``sum_i G[p, i] X_i`` (for ``concat``, tile ``i``
is scaled by ``G[p, i]``), and parity model ``p`` learns ``sum_i G[p, i] F(X_i)``. For a linear F
this is exact; for r = 1 it is the paper's code unchanged.

Shapes: an encoder is built for one ``input_shape`` (one query, without a batch dimension); each
query may also carry a leading batch dimension (the i-th rows of the k query batches are encoded
together, section 4.1), as long as all k have the same one. Bad input (k or r out of range, an
unknown encoder, shapes that do not match) is a :class:`~failsoft.errors.ConfigError` that names the
value. This module imports no implementation; :mod:`failsoft.policies.registry` maps names to them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from failsoft.errors import ConfigError

K_MIN, K_MAX = 2, 4  # CodedParams.k: the paper evaluates k of 2, 3 and 4 (section 5.1)
R_MIN, R_MAX = 1, 4  # CodedParams.r


def check_code(k: object, r: object) -> tuple[int, int]:
    """``(k, r)`` when both are integers in range, else :class:`ConfigError` naming the bad one."""
    for name, value, low, high in (("k", k, K_MIN, K_MAX), ("r", r, R_MIN, R_MAX)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
            raise ConfigError(f"coding parameter {name} must be an integer in {low}..{high}; got {value!r}")
    return int(k), int(r)  # type: ignore[call-overload]


def check_member(index: object, k: int, r: int) -> int:
    """``index`` when it names a member of a (k, r) group (``0..k+r-1``), else :class:`ConfigError`."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < k + r:
        raise ConfigError(f"member index must be in 0..{k + r - 1} (k={k}, r={r}); got {index!r}")
    return int(index)


def code_matrix(k: int, r: int) -> np.ndarray:
    """The r x k coefficients ``G[p, i] = (i + 1) ** p`` (float64): row 0 is the plain sum."""
    k, r = check_code(k, r)
    nodes = np.arange(1, k + 1, dtype=np.float64)
    return nodes[None, :] ** np.arange(r, dtype=np.float64)[:, None]


class Encoder(ABC):
    """k queries in, r parity queries out (ParM section 4.2). Pure and stateless after construction.

    ``input_shape`` is the shape of one query without a batch dimension. ``coefficients`` is the
    code's ``G`` (r x k); parity query ``p`` combines the k queries with the weights ``G[p]``.
    """

    name: ClassVar[str]

    def __init__(self, k: int, r: int = 1, input_shape: tuple[int, ...] = (64,)) -> None:
        self.k, self.r = check_code(k, r)
        shape = tuple(input_shape)
        if not shape or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ConfigError(f"{self.name} encoder: input_shape must be positive sizes; got {input_shape!r}")
        self.input_shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.coefficients = code_matrix(self.k, self.r)
        self._weights = [tuple(float(w) for w in row) for row in self.coefficients]

    def encode(self, queries: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """The r parity queries (float32, each the shape of one input query) for ``queries``."""
        arrays = self._checked(queries)
        return tuple(self._combine(arrays, self._weights[p]) for p in range(self.r))

    def parity_target(self, outputs: Sequence[np.ndarray] | np.ndarray, index: int = 0) -> np.ndarray:
        """What parity model ``index`` is trained to output: ``sum_i G[index, i] F(X_i)``.

        ``outputs`` holds the k deployed outputs (any common shape, e.g. ``(N, classes)``).
        """
        if not 0 <= index < self.r:
            raise ConfigError(f"parity index must be in 0..{self.r - 1}; got {index!r}")
        outs = np.asarray(outputs, dtype=np.float64)
        if outs.shape[:1] != (self.k,):
            raise ConfigError(f"expected {self.k} deployed outputs; got {outs.shape[:1] or 'none'}")
        return np.tensordot(self.coefficients[index], outs, axes=1).astype(np.float32)

    def _checked(self, queries: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The k queries as float32 arrays of one shape, ``[N,] *input_shape``; shapes checked."""
        if len(queries) != self.k:
            raise ConfigError(f"{self.name} encoder with k={self.k} got {len(queries)} queries")
        arrays = [np.asarray(q) for q in queries]
        first = arrays[0].shape
        n = len(self.input_shape)
        if first[-n:] != self.input_shape or len(first) not in (n, n + 1):
            raise ConfigError(
                f"{self.name} encoder expects queries of shape {self.input_shape} (or a batch of them); "
                f"got {first}"
            )
        for i, a in enumerate(arrays):
            if a.shape != first:
                raise ConfigError(f"query {i} has shape {a.shape}; query 0 has {first}: all k must match")
            if a.dtype.kind not in "fiu":
                raise ConfigError(f"query {i} has dtype {a.dtype}; expected numbers")
        return arrays

    @abstractmethod
    def _combine(self, queries: list[np.ndarray], weights: tuple[float, ...]) -> np.ndarray:
        """One parity query (float32) from the k checked queries and their k weights."""


class Decoder(ABC):
    """Outputs that arrived in, missing data outputs out (ParM section 4.2, and 7 for r > 1).

    ``decode`` takes ``{member index: output}`` (data members ``0..k-1``, parity members
    ``k..k+r-1``) and returns ``{data index: reconstructed output}`` for every data member absent
    from it, when at least k members are present; with fewer it returns ``None`` (not decodable
    yet). With all k data outputs present there is nothing to reconstruct: ``{}``.
    """

    name: ClassVar[str]

    def __init__(self, k: int, r: int = 1) -> None:
        self.k, self.r = check_code(k, r)
        self.coefficients = code_matrix(self.k, self.r)
        self._members = frozenset(range(self.k + self.r))

    def decode(self, available: Mapping[int, np.ndarray]) -> dict[int, np.ndarray] | None:
        present = self._check(available)
        missing = [i for i in range(self.k) if i not in present]
        if len(present) < self.k:
            return None
        if not missing:
            return {}
        return self.solve(available, missing)

    def _check(self, available: Mapping[int, np.ndarray]) -> set[int]:
        present = available.keys()
        if not self._members.issuperset(present):
            for index in available:
                check_member(index, self.k, self.r)
        first = None
        for index, out in available.items():  # a plain loop: this runs once per answer, keep it lean
            shape = out.shape if isinstance(out, np.ndarray) else np.shape(out)
            if first is None:
                first = shape
            elif shape != first:
                raise ConfigError(f"output of member {index} has shape {shape}; others have {first}")
        return set(present)

    @abstractmethod
    def solve(self, available: Mapping[int, np.ndarray], missing: list[int]) -> dict[int, np.ndarray]:
        """The ``missing`` data outputs, unchecked: at least ``len(missing)`` parity outputs are in
        ``available``, every key is a member and every output has one shape. :meth:`decode` checks
        all that first; :class:`~failsoft.policies.coding.groups.AnswerTracker` checks each answer
        as it arrives and calls this directly, so the decode on the serving path is only the
        arithmetic (ParM's 8 us budget at k = 2, section 6.2.5)."""
