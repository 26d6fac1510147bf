"""Stateful models: outputs that depend on the requests before them, and a state that can move.

HAMS (DSN'20, III-A) serves graphs in which some models are *stateful*: an RNN's hidden state, an
online learner's weights. A crash loses that state, and a backup must hold a copy of it. A stateful
model in failsoft is a loaded variant (a :class:`~failsoft.zoo.loaded.LoadedModel`, so an agent loads
it like any other) with three operations:

* ``compute(batch) -> outputs``: answers the batch's requests **in order**, one after the other, and
  folds each into the state (``predict`` is the same call). A batch of N is exactly N requests: the
  outputs and the state do not depend on how requests are batched, which is what a replay needs.
* ``state() -> ModelState``: a copy of the state (numpy arrays), the model it belongs to and its
  sequence number ``seq`` (how many requests it has folded in since the initial state);
  ``ModelState.to_bytes()`` is a safetensors blob that an agent ships to another agent as it is.
* ``apply_state(state)``: replaces the state, atomically (under the model's lock), with one shipped
  from another copy of the same model (a ``ModelState`` or its bytes). A state of another model (family,
  variant or weights), or with other arrays, shapes or dtypes, is refused with
  :class:`~failsoft.errors.StateMismatchError` naming what differs. ``apply_state`` does not check
  that ``seq`` grows: which state a backup may apply is the protocol's decision
  (:mod:`failsoft.policies.replication`), and a rollback applies an older one.

These three (and ``reset()``) are the :class:`~failsoft.zoo.state.Stateful` interface, which a
user's stateful handler served through :mod:`failsoft.zoo.formats.stateful_handler` satisfies too;
:class:`~failsoft.zoo.state.ModelState` and its wire form live in :mod:`failsoft.zoo.state`.

The two families (``failsoft zoo build -f sp500_gru`` / ``-f digits_online``; ``config.json`` says
``"stateful": true``):

* ``sp500_gru``: a GRU cell over the SP500 series shipped in ``failsoft/data/hams/sp500`` (HAMS's
  stock-prediction data); a request is one value of the series, the answer the predicted next value,
  and the **hidden state** is carried from request to request. The weights are trained here and fixed;
  the state is the hidden vector (``hidden`` floats).
* ``digits_online``: a digits classifier whose linear head learns online: a request is the 64 pixels
  and a label (``-1``: unlabelled); the answer is the logits *before* learning from it (prequential),
  then a labelled request takes one SGD step on the cross-entropy. The **head's weights** are the state.
  The features under the head (none for ``logreg``, a hidden layer for ``mlp_head``) are pretrained
  on the first ``pretrain_images`` training images and fixed.

**Determinism.** On CPU, compute is deterministic: the same weights, state and inputs give bit-equal
outputs and states (every request runs the same float32 ops in the same order, whatever the batch;
the tests check it across a state transfer). Summation order inside a matrix product can depend on
the number of threads (oneDNN/BLAS blocking), so copies meant to agree should use the same thread
count, as the agents do (``agents.torch_threads``). On a GPU, non-determinism would come from kernels
that sum with atomic adds or pick an algorithm by autotuning (cuBLAS split-K reductions, cuDNN's RNN
and benchmark mode), and from TF32 matrix products unless disabled: a replay could then give other
outputs, which is the case HAMS's NSPB handles (it never replays what a client saw).
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.errors import ConfigError
from failsoft.zoo.digits import (
    DIGITS_CLASSES,
    DIGITS_INPUT_SHAPE,
    DigitsSplit,
    build_digits_module,
    load_digits_split,
)
from failsoft.zoo.layout import STATEFUL_ARCHES, Accuracy, VariantConfig
from failsoft.zoo.loaded import LoadedModel
from failsoft.zoo.state import ModelState as ModelState  # its home; imported from here before
from failsoft.zoo.state import StateKeeper
from failsoft.zoo.train import Training, measure_accuracy, train_digits

if TYPE_CHECKING:
    import torch

SP500_CSV = "SP500_Trends.csv"
SP500_TRAIN_FRACTION = 0.8  # the first 80 % of the series train the GRU, the rest measures it
SP500_WINDOW = 50  # steps per training window
UNLABELLED = -1


# ----------------------------------------------------------------------------------------------
# The loaded stateful model
# ----------------------------------------------------------------------------------------------


class StatefulModel(LoadedModel, StateKeeper):
    """A loaded stateful variant: ``compute``/``state``/``apply_state`` (see the module docstring)."""

    def __init__(self, config: VariantConfig, device: str, module: torch.nn.Module) -> None:
        module.requires_grad_(False)  # served: its state changes in place, never by autograd
        super().__init__(
            config.family, config.variant, device, config.input_shape, config.num_classes, module, module
        )
        self.architecture = dict(config.architecture)
        self._keep_state(f"{config.family}/{config.variant}@{config.weights_sha256[:12]}")

    # the requests (the state's half is StateKeeper's) -------------------------------------------
    def compute(self, batch: np.ndarray) -> np.ndarray:
        """Answer the batch's requests in order, folding each into the state; float32 outputs."""
        import torch

        if self._module is None:
            raise ConfigError(f"model {self.family}/{self.variant} is closed")
        x = self._check(batch)
        self._check_rows(x)
        with self._lock, torch.no_grad():
            rows = torch.from_numpy(x).to(self.device)
            out = torch.stack([self._step(rows[i : i + 1]) for i in range(len(rows))])
            self._seq += len(rows)
        return out.float().cpu().numpy()

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """The same as :meth:`compute`: a stateful model's answer always updates its state."""
        return self.compute(batch)

    # what each family defines --------------------------------------------------------------
    def _check_rows(self, x: np.ndarray) -> None:
        """Refuse requests this model cannot take (beyond their shape)."""

    def _step(self, row: torch.Tensor) -> torch.Tensor:
        """One request (a ``(1, *input_shape)`` row): its output (``(num_classes,)``), state updated.
        (Each family also defines :class:`StateKeeper`'s ``_arrays`` and ``_load_arrays``.)"""
        raise NotImplementedError


class GruForecaster(StatefulModel):
    """``sp500_gru``: a request is one series value, the answer the predicted next one (a variant
    with ``inputs: k`` reads k values a request: the current one and the k - 1 before it).

    The state is the GRU's hidden vector, ``hidden`` float32 values, zero at the start.
    """

    def __init__(self, config: VariantConfig, device: str, module: torch.nn.Module) -> None:
        import torch

        self._hidden = torch.zeros(1, int(config.architecture["hidden"]), device=device)
        super().__init__(config, device, module)

    def example_batch(self, batch_size: int) -> np.ndarray:
        """The first values of the SP500 series (with their lags for a GRU reading several)."""
        import torch

        k = self.input_shape[0]
        return sp500_lags(torch.from_numpy(sp500_series().copy()), k)[:batch_size].numpy()

    def _step(self, row: torch.Tensor) -> torch.Tensor:
        m = self._module
        z = (torch_log1p(row) - self.architecture["mean"]) / self.architecture["std"]
        self._hidden = m["cell"](z, self._hidden)
        pred = m["head"](self._hidden)[0] * self.architecture["std"] + self.architecture["mean"]
        return pred.expm1()

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"hidden": self._hidden.detach().cpu().numpy().copy()}

    def _load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        import torch

        self._hidden = torch.from_numpy(np.array(arrays["hidden"])).to(self.device)


class OnlineDigits(StatefulModel):
    """``digits_online``: a request is 64 pixels and a label (-1: none); the answer, the logits.

    The state is the linear head's ``weight`` (10 x features) and ``bias`` (10), float32.
    """

    def _check_rows(self, x: np.ndarray) -> None:
        labels = x[:, -1]
        bad = labels[(labels != UNLABELLED) & ~np.isin(labels, np.arange(DIGITS_CLASSES))]
        if bad.size:
            raise ConfigError(
                f"{self.family}/{self.variant}: a request's last value is its label, 0 to "
                f"{DIGITS_CLASSES - 1} or {UNLABELLED} for none; got {float(bad[0])!r}"
            )

    def _step(self, row: torch.Tensor) -> torch.Tensor:
        import torch

        net = self._module
        features = net[:-1](row[:, :-1])[0]
        head = net[-1]
        logits = head(features[None])[0]
        label = int(row[0, -1])
        if label != UNLABELLED:  # one SGD step on the cross-entropy: d/dlogits = softmax - onehot
            grad = torch.softmax(logits, dim=0)
            grad[label] -= 1.0
            lr = float(self.architecture["online_lr"])
            head.weight -= lr * torch.outer(grad, features)
            head.bias -= lr * grad
        return logits

    def example_batch(self, batch_size: int) -> np.ndarray:
        """Labelled training images (each request then also takes its SGD step: the costlier case)."""
        split = load_digits_split()
        labels = split.y_train[:batch_size, None].astype(np.float32)
        return np.concatenate([split.x_train[:batch_size], labels], axis=1)

    def _arrays(self) -> dict[str, np.ndarray]:
        head = self._module[-1]
        return {
            "weight": head.weight.detach().cpu().numpy().copy(),
            "bias": head.bias.detach().cpu().numpy().copy(),
        }

    def _load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        import torch

        head = self._module[-1]
        head.weight.copy_(torch.from_numpy(np.array(arrays["weight"])))
        head.bias.copy_(torch.from_numpy(np.array(arrays["bias"])))


def torch_log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) of a non-negative series value (negative values are clipped to 0)."""
    return x.clamp(min=0).log1p()


_CLASSES: dict[str, type[StatefulModel]] = {"sp500_gru": GruForecaster, "digits_online": OnlineDigits}


def load_stateful(config: VariantConfig, device: str, module: torch.nn.Module) -> StatefulModel:
    """The loaded model of a stateful variant (``module`` holds its weights, on ``device``)."""
    return _CLASSES[config.arch](config, device, module)


# ----------------------------------------------------------------------------------------------
# Building: the networks, the data, the training
# ----------------------------------------------------------------------------------------------


def build_stateful_module(arch: str, architecture: Mapping[str, Any]) -> torch.nn.Module:
    """The network of a stateful variant, randomly initialised (its weights are then loaded)."""
    from torch import nn

    if arch == "sp500_gru":
        hidden = int(architecture["hidden"])
        return nn.ModuleDict(
            {"cell": nn.GRUCell(gru_inputs(architecture), hidden), "head": nn.Linear(hidden, 1)}
        )
    if arch == "digits_online":
        return build_digits_module("digits_mlp", {"hidden": list(architecture["hidden"])})
    raise KeyError(f"unknown stateful architecture {arch!r}")


def stateful_io(arch: str, architecture: Mapping[str, Any] | None = None) -> tuple[tuple[int, ...], int]:
    """(input shape of one request, outputs per request) of a stateful architecture."""
    if arch == "sp500_gru":
        return (gru_inputs(architecture or {}),), 1
    return (DIGITS_INPUT_SHAPE[0] + 1,), DIGITS_CLASSES


def gru_inputs(architecture: Mapping[str, Any]) -> int:
    """Values per request of an ``sp500_gru`` variant: 1 (the current value), or ``inputs`` (the
    current value and the ``inputs - 1`` before it; what a fan-in of that many GRUs feeds it)."""
    return int(architecture.get("inputs", 1))


def is_stateful_arch(arch: str) -> bool:
    return arch in STATEFUL_ARCHES


@cache
def sp500_series() -> np.ndarray:
    """The shipped SP500 series (HAMS's ``SP500_Trends.csv``: one value per S&P 500 company, in file
    order), float32, read-only."""
    text = (resources.files("failsoft") / "data" / "hams" / "sp500" / SP500_CSV).read_text()
    values = [float(row[1]) for row in csv.reader(text.splitlines()) if len(row) == 2]
    out = np.asarray(values, dtype=np.float32)
    out.setflags(write=False)
    return out


def sp500_architecture(hidden: int, inputs: int = 1) -> dict[str, Any]:
    """The GRU's config: its width, the values it reads per request (``inputs``, left out when 1)
    and the log1p normalisation of the training part of the series."""
    series = np.log1p(sp500_series().astype(np.float64))
    train = series[: int(len(series) * SP500_TRAIN_FRACTION)]
    out: dict[str, Any] = {"hidden": hidden}
    if inputs != 1:
        out["inputs"] = inputs
    return out | {"mean": round(float(train.mean()), 6), "std": round(float(train.std()), 6)}


def sp500_lags(z: torch.Tensor, inputs: int) -> torch.Tensor:
    """Row ``t`` holds ``z[t], z[t-1], ..., z[t-inputs+1]`` (the first value repeated before the
    start): what a GRU reading ``inputs`` values per request is trained and measured on."""
    import torch

    return torch.stack([torch.cat([z[:1].expand(j), z[: len(z) - j]]) for j in range(inputs)], dim=1)


def train_stateful(
    arch: str, module: torch.nn.Module, architecture: Mapping[str, Any], training: Training
) -> tuple[float, dict[str, Any]]:
    """Train a stateful variant in place; its measured accuracy in [0, 1] and how it was measured."""
    if arch == "sp500_gru":
        return _train_gru(module, architecture, training)
    return _train_online(module, architecture, training)


def _train_gru(
    module: Any, architecture: Mapping[str, Any], training: Training
) -> tuple[float, dict[str, Any]]:
    """Adam on the training part cut into windows of ``SP500_WINDOW`` steps, each from a zero state
    (truncated backpropagation through time, with ``nn.GRU``: the cell's weights), then the
    held-out part served request by request through the cell, the state carried on from training.

    The accuracy is *directional*: the share of held-out steps where the predicted move (next value
    above or below the current one) is the actual move; the detail compares the mean squared error
    (log1p scale) with the persistence forecast (next = current).
    """
    import torch
    from torch import nn

    series = torch.from_numpy(sp500_series().copy()).log1p()
    z = (series - architecture["mean"]) / architecture["std"]
    n_train = int(len(z) * SP500_TRAIN_FRACTION)
    hidden, k = int(architecture["hidden"]), gru_inputs(architecture)
    lags = sp500_lags(z, k)
    rnn = nn.GRU(k, hidden, batch_first=True)
    head = module["head"]
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=training.lr)
    windows = (n_train - 1) // SP500_WINDOW  # truncated BPTT: windows of the training part, as one batch
    x = lags[: windows * SP500_WINDOW].reshape(windows, SP500_WINDOW, k)
    y = z[1 : windows * SP500_WINDOW + 1].view(windows, SP500_WINDOW, 1)
    for _ in range(training.epochs):
        opt.zero_grad(set_to_none=True)
        out, _ = rnn(x)
        nn.functional.mse_loss(head(out), y).backward()
        opt.step()
    cell = module["cell"]
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(rnn, f"{name}_l0"))
        h = torch.zeros(1, hidden)
        preds = []
        for t in range(len(z) - 1):
            h = cell(lags[t].view(1, k), h)
            preds.append(float(head(h)[0, 0]))
    pred = np.asarray(preds[n_train - 1 :])
    now, nxt = z[n_train - 1 : -1].numpy(), z[n_train:].numpy()
    hit = np.sign(pred - now) == np.sign(nxt - now)
    scale = architecture["std"] ** 2
    return float(hit.mean()), {
        "dataset": f"failsoft/data/hams/sp500/{SP500_CSV} (log1p, normalised)",
        "measure": "directional accuracy, held-out steps",
        "n_train": n_train,
        "n_test": len(nxt),
        "mse_log1p": round(float(((pred - nxt) ** 2).mean() * scale), 6),
        "persistence_mse_log1p": round(float(((now - nxt) ** 2).mean() * scale), 6),
        "mean_mse_log1p": round(float((nxt**2).mean() * scale), 6),
    }


def _train_online(
    module: torch.nn.Module, architecture: Mapping[str, Any], training: Training
) -> tuple[float, dict[str, Any]]:
    """Pretrain on the first ``pretrain_images`` training images; the accuracy is the held-out
    top-1 at that point (what the model starts serving with). The detail adds the top-1 after the
    rest of the training split has been streamed through it once as labelled requests (the online
    learning the state carries)."""
    split = load_digits_split()
    n = int(architecture["pretrain_images"])
    train_digits(
        module, training, DigitsSplit(split.x_train[:n], split.y_train[:n], split.x_test, split.y_test)
    )
    start, detail = measure_accuracy(module, split)
    shape, classes = stateful_io("digits_online")
    draft = VariantConfig("", "", "digits_online", dict(architecture), shape, classes, 0, 0, "0" * 64, _NONE)
    learner = OnlineDigits(draft, "cpu", copy.deepcopy(module))
    stream = np.concatenate([split.x_train[n:], split.y_train[n:, None].astype(np.float32)], axis=1)
    learner.compute(stream)
    after, _ = measure_accuracy(learner._module, split)
    return start, detail | {
        "pretrain_images": n,
        "online_images": len(stream),
        "accuracy_after_online_pass": after,
    }


_NONE = Accuracy(0.0, "declared")
