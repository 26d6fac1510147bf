"""A user's stateful handler served as a stateful model: the same state interface as the zoo's own.

A handler that defines ``state()`` and ``apply_state()`` (:func:`~failsoft.zoo.formats.interface.
is_stateful`) loads as a :class:`StatefulHandlerModel`, which is a
:class:`~failsoft.zoo.state.Stateful` exactly as the built-in
:class:`~failsoft.zoo.stateful.StatefulModel` is: the agents take and apply its state as
:class:`~failsoft.zoo.state.ModelState` bytes, HAMS's replication ships them, and ``zoo add``,
``exposes_state`` and the state-cost tool treat both alike. What the wrapper adds to the handler:

* **one request at a time**: a batch of N rows is fed to the handler as N requests of one row, in
  order, under the model's lock, so the answers and the state do not depend on how the serving
  queue batched them (a replay after a failover batches differently) and a state is never taken
  in the middle of a request;
* **the count**: ``seq`` is the rows folded in since the initial state, which HAMS matches states
  to requests by;
* **the checks**: ``state()`` must return named numeric numpy arrays (copied, so the handler may
  return its own), and a state to apply must have the names, shapes and dtypes of the one taken
  after ``load`` and belong to the same model (family, variant and weights), else
  :class:`~failsoft.errors.StateMismatchError` names what differs;
* **reset**: the handler's ``reset()`` if it defines one, else the state kept after ``load``.

:func:`check_round_trip` is what ``zoo add`` asks of a stateful handler before it enters the
repository: a state taken and applied again (through its bytes) gives the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, FailsoftError, ServingError, StateMismatchError
from failsoft.zoo.formats.interface import Handler, Signature, defines
from failsoft.zoo.formats.model import HandlerModel
from failsoft.zoo.layout import VariantConfig
from failsoft.zoo.state import ModelState, StateKeeper

STATE_KINDS = "biuf"  # numpy kinds a state array may have: bool, int, uint, float (safetensors')


class StatefulHandlerModel(HandlerModel, StateKeeper):
    """A loaded stateful handler: ``compute``/``state``/``apply_state``/``reset`` (module doc)."""

    def __init__(
        self,
        config: VariantConfig,
        device: str,
        handler: Handler,
        signature: Signature,
        sample: np.ndarray | None = None,
    ) -> None:
        super().__init__(config, device, handler, signature, sample)
        self._keep_state(f"{config.family}/{config.variant}@{config.weights_sha256[:12]}")

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's rows through the handler one at a time, in order, each counted once folded in."""
        if self.closed:
            raise ConfigError(f"model {self.family}/{self.variant} is closed")
        rows = len(next(iter(inputs.values())))
        if rows == 0:  # no request: nothing to fold in
            return self.handler.infer(inputs)
        answers = []
        with self._lock:
            for i in range(rows):
                try:
                    answers.append(self.handler.infer({k: v[i : i + 1] for k, v in inputs.items()}))
                except FailsoftError:
                    raise
                except Exception as exc:  # the user's code: name it (rows before it are counted)
                    raise ServingError(
                        f"{self.model_id}: the handler failed on a request: {type(exc).__name__}: {exc}"
                    ) from exc
                self._seq += 1
        return {name: np.concatenate([np.asarray(a[name]) for a in answers]) for name in answers[0]}

    def compute(self, batch: np.ndarray) -> np.ndarray:
        """The same as ``predict``: a stateful model's answer always updates its state."""
        return self.predict(batch)

    def reset(self) -> None:
        """Back to the state after ``load``: the handler's ``reset()``, else the state kept then."""
        if not defines(type(self.handler), "reset"):
            super().reset()
            return
        with self._lock:
            self._call("reset")
            self._seq = 0

    def _arrays(self) -> dict[str, np.ndarray]:
        """The handler's ``state()``, checked and copied."""
        got = self._call("state")
        where = f"{type(self.handler).__name__}.state()"
        if not isinstance(got, Mapping) or not got:
            what = "no arrays" if isinstance(got, Mapping) else type(got).__name__
            raise ConfigError(f"{where} returned {what}, not a mapping of names to numpy arrays")
        out = {}
        for name, value in got.items():
            arr = np.array(value, copy=True)
            if not isinstance(name, str) or arr.dtype.kind not in STATE_KINDS:
                raise ConfigError(
                    f"{where}: array {name!r} is {arr.dtype}: a state holds named arrays of numbers "
                    "or booleans (they travel as safetensors)"
                )
            out[name] = arr
        return out

    def _load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copies to the handler (it may keep them; the state they came from stays as it was)."""
        self._call("apply_state", {k: np.array(v, copy=True) for k, v in arrays.items()})

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.handler, method)(*args)
        except FailsoftError:
            raise
        except Exception as exc:  # the user's code: name the method, keep the cause
            raise ServingError(
                f"{self.model_id}: the handler's {method}() failed: {type(exc).__name__}: {exc}"
            ) from exc


def check_round_trip(model: StatefulHandlerModel, inputs: Mapping[str, np.ndarray]) -> None:
    """What ``zoo add`` asks of a stateful handler, on the user's sample ``inputs``: its state
    travels as bytes and fits the model again; applying a state taken earlier gives the answers the
    model gave from it (twice: after the requests that followed it, and back at its start); and the
    same requests from the same state leave the same state. One ConfigError line otherwise."""
    name = f"stateful handler {type(model.handler).__name__}"
    try:
        start = ModelState.from_bytes(model.state().to_bytes())
        first = model.infer(inputs)
        middle = ModelState.from_bytes(model.state().to_bytes())
        second = model.infer(inputs)
        model.apply_state(middle.to_bytes())
        _same(name, "applying the state it had before them", second, model.infer(inputs))
        model.apply_state(start.to_bytes())
        _same(name, "applying its first state again", first, model.infer(inputs))
    except StateMismatchError as exc:
        raise ConfigError(f"{name}: its own state() does not fit its apply_state(): {exc}") from exc
    except ServingError as exc:
        raise ConfigError(f"{name}: {exc}") from exc
    again = model.state()
    for key, arr in middle.arrays.items():
        if not np.array_equal(np.asarray(again.arrays[key]), arr, equal_nan=arr.dtype.kind == "f"):
            raise ConfigError(
                f"{name}: the same requests from the same state left another state "
                f"(array {key!r} differs): answers must depend only on the state and the request"
            )


def _same(name: str, after: str, expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> None:
    for key, want in expected.items():
        arr = np.asarray(want)
        if not np.array_equal(arr, np.asarray(got[key]), equal_nan=arr.dtype.kind == "f"):
            raise ConfigError(
                f"{name}: after {after}, output {key!r} differs on the same requests: "
                "apply_state(state()) must restore the answers"
            )
