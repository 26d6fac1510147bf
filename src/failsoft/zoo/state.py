"""A stateful model's state, and the one interface HAMS moves it through.

HAMS (DSN'20, III-A) keeps a backup of every stateful graph node and ships the primary's state to
it. Two kinds of model carry such a state in failsoft: the zoo's own stateful families
(:class:`~failsoft.zoo.stateful.StatefulModel`) and a user's handler that defines ``state()`` and
``apply_state()`` (:class:`~failsoft.zoo.formats.stateful_handler.StatefulHandlerModel`). The agents,
the gateway's replication and the state-cost tool know only :class:`Stateful`, which both satisfy:

* ``compute(batch)``: answers the batch's rows **in order**, one request at a time, each folded into
  the state (``predict`` is the same call): a batch of N is exactly N requests;
* ``state()``: a :class:`ModelState` (a copy of the arrays, the model's id, ``seq``: the rows folded
  in since the initial state), taken between two requests;
* ``apply_state(state)``: a :class:`ModelState` or its bytes swapped in atomically; a state that
  does not fit the model is refused with :class:`~failsoft.errors.StateMismatchError` naming what
  differs (:func:`check_fits`);
* ``reset()``: back to the initial state (what an agent does after a load's warm-up, and HAMS's
  ``none`` restart).

A state travels as safetensors bytes (:meth:`ModelState.to_bytes`): named numpy arrays and a small
metadata header, never pickle. :class:`StateKeeper` is the half both kinds share: the lock, the
count, the copy of the state and the fit check, over two hooks each kind defines.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from failsoft.errors import StateMismatchError

STATE_FORMAT = "failsoft-state/1"


@dataclass(frozen=True)
class ModelState:
    """A stateful model's state: its arrays, the model it belongs to and how many requests it holds.

    ``model`` is ``family/variant@<first 12 hex of the weights' sha256>``: a state fits only the
    model built from the same weights. ``seq`` counts the requests folded in since the initial state.
    """

    model: str
    seq: int
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """The bytes of the arrays themselves (``len(to_bytes())`` adds a small header)."""
        return sum(a.nbytes for a in self.arrays.values())

    def to_bytes(self) -> bytes:
        """The state as safetensors bytes, ``model`` and ``seq`` in its metadata (what travels)."""
        from safetensors.numpy import save

        metadata = {"format": STATE_FORMAT, "model": self.model, "seq": str(self.seq)}
        return bytes(save({k: np.ascontiguousarray(v) for k, v in self.arrays.items()}, metadata=metadata))

    @classmethod
    def from_bytes(cls, data: bytes) -> ModelState:
        """Read back :meth:`to_bytes`; anything else is a :class:`StateMismatchError`."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            (size,) = struct.unpack("<Q", data[:8])
            metadata = json.loads(data[8 : 8 + size]).get("__metadata__") or {}
            arrays = load(data)
        except (struct.error, ValueError, SafetensorError) as exc:
            raise StateMismatchError(f"not a model state (safetensors bytes expected): {exc}") from exc
        if metadata.get("format") != STATE_FORMAT:
            raise StateMismatchError(
                f"not a model state: format {metadata.get('format')!r}, not {STATE_FORMAT!r}"
            )
        try:
            seq = int(metadata["seq"])
        except (KeyError, ValueError):
            raise StateMismatchError(f"model state without a valid seq: {metadata.get('seq')!r}") from None
        return cls(str(metadata.get("model", "")), seq, arrays)


def check_fits(model_id: str, reference: Mapping[str, np.ndarray], state: ModelState) -> None:
    """Refuse ``state`` unless it belongs to ``model_id`` and has the arrays of ``reference`` (the
    model's initial state): the same names, shapes and dtypes. The error names what differs."""
    where = f"state of {state.model!r} (seq {state.seq})"
    if state.model != model_id:
        raise StateMismatchError(f"{where} does not fit model {model_id!r}: another model")
    if state.seq < 0:
        raise StateMismatchError(f"{where}: seq must be >= 0")
    if sorted(state.arrays) != sorted(reference):
        raise StateMismatchError(
            f"{where} does not fit model {model_id!r}: arrays {sorted(state.arrays)}, "
            f"expected {sorted(reference)}"
        )
    for name, ref in reference.items():
        got = np.asarray(state.arrays[name])
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise StateMismatchError(
                f"{where} does not fit model {model_id!r}: array {name!r} is {got.dtype}"
                f"{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
            )


@runtime_checkable
class Stateful(Protocol):
    """A loaded model whose answers depend on the requests before it (see the module docstring)."""

    model_id: str  # family/variant@<weights sha256, 12 hex>: which states fit it
    input_shape: tuple[int, ...]  # one request's (a LoadedModel's)

    @property
    def seq(self) -> int:
        """The rows folded in since the initial state (what a state's ``seq`` says)."""
        ...

    def compute(self, batch: np.ndarray) -> np.ndarray:
        """Answer the batch's rows in order, folding each into the state."""
        ...

    def state(self) -> ModelState:
        """A copy of the state, taken between two requests."""
        ...

    def apply_state(self, state: ModelState | bytes) -> None:
        """Swap ``state`` in atomically; StateMismatchError when it does not fit."""
        ...

    def reset(self) -> None:
        """Back to the initial state."""
        ...


class StateKeeper:
    """``seq``/``state``/``apply_state``/``reset`` over two hooks: ``_arrays()`` (a copy of the state)
    and ``_load_arrays(arrays)`` (swap a fitting state in). A model calls :meth:`_keep_state` once
    loaded, counts the rows it folds in (``_seq``) and computes under ``_lock``, so that a state is
    taken or swapped only between two requests."""

    model_id: str
    _lock: threading.Lock
    _seq: int
    _initial: dict[str, np.ndarray]

    def _keep_state(self, model_id: str) -> None:
        """Start counting from the state the model holds now (its initial state)."""
        self.model_id = model_id
        self._lock = threading.Lock()
        self._seq = 0
        self._initial = self._arrays()

    @property
    def seq(self) -> int:
        """The rows folded in since the initial state."""
        return self._seq

    def state(self) -> ModelState:
        """A copy of the current state (arrays on the CPU) with its sequence number."""
        with self._lock:
            return ModelState(self.model_id, self._seq, self._arrays())

    def apply_state(self, state: ModelState | bytes) -> None:
        """Replace the state with ``state`` (a :class:`ModelState` or its bytes); a misfit is refused."""
        if isinstance(state, (bytes, bytearray, memoryview)):
            state = ModelState.from_bytes(bytes(state))
        check_fits(self.model_id, self._initial, state)
        with self._lock:
            self._load_arrays(state.arrays)
            self._seq = state.seq

    def reset(self) -> None:
        """Back to the initial state (what a restart without a backup gives: HAMS's ``none``)."""
        self.apply_state(ModelState(self.model_id, 0, self._initial))

    def _arrays(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        raise NotImplementedError
