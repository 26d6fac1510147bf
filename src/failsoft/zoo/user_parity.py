"""ParM parity models for a user's classifier, trained from the user's own inputs (``--data``).

ParM (section 4.4) trains a parity model on parity queries built from k samples of the deployed
model's *training inputs*, to output the coded sum of the deployed model's outputs on them. For the
zoo's digits families those inputs are scikit-learn's digits (:mod:`failsoft.zoo.parity`); for a
user's model (any format: ONNX, ``torch.export``, ``transformers``, a handler) they are the user's:
an ``.npz`` holding the inputs (``x``, ``inputs`` or the model's input name) and, optionally, their
labels (``y`` or ``labels``). The targets are the deployed model's own outputs, computed once
through its handler, whatever its format.

The parity model cannot be the user's graph retrained (an ONNX file or an exported program is not
a training graph), so it is a network of failsoft's, trained in torch with ParM's hyper-parameters
and initialisation: an MLP over the flattened query (:data:`HIDDEN` units, two hidden layers), the
architecture ParM uses for its MNIST experiments. It is then exported in the format the user asks
(``onnx`` by default, or ``pt2``) and stored like an added variant of family ``<family>_parity``,
with the ``parity`` block that :func:`~failsoft.zoo.parity.check_parity` reads, so a ``coded``
service of the user's family is checked and served like one of the zoo's.

Degraded-mode accuracy is measured as for the digits (section 5) on a seeded held-out fifth of the
data: against the labels when the file has them, else against the deployed model's own answers
(which is then the reconstruction rate).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.errors import ConfigError
from failsoft.policies.registry import get_encoder
from failsoft.zoo.digits import DigitsSplit
from failsoft.zoo.formats.interface import TensorSpec
from failsoft.zoo.layout import CONFIG_FILE, Accuracy, ModelFormat, VariantConfig, write_json
from failsoft.zoo.parity import (
    PARITY_SUFFIX,
    ParityCode,
    ParityResult,
    ParityTraining,
    _epoch,
    _paper_init,
    measure_degraded,
    parity_block,
)
from failsoft.zoo.repository import ModelRepository
from failsoft.zoo.samples import INPUT_KEYS, LABEL_KEYS

if TYPE_CHECKING:
    import torch

    from failsoft.zoo.profiler import ProfileSettings

HIDDEN = (256, 256)
TEST_FRACTION = 0.2
SPLIT_SEED = 0
PARITY_FORMATS = ("onnx", "pt2")
PREDICT_ROWS = 256


def train_user_parity(
    repo: ModelRepository,
    code: ParityCode,
    data_file: Path,
    training: ParityTraining | None = None,
    parity_format: str = "onnx",
    profile: bool = True,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> ParityResult:
    """Train, measure, export and store one parity model of a user's variant from ``data_file``."""
    from failsoft.zoo.build import install_variant
    from failsoft.zoo.profiler import profile_variant

    if parity_format not in PARITY_FORMATS:
        raise ConfigError(
            f"parity models are exported as {' or '.join(PARITY_FORMATS)}, not {parity_format!r}"
        )
    deployed = _deployed(repo, code)
    encoder = get_encoder(code.encoder, code.k, code.r, deployed.input_shape)
    split = _split(data_file, deployed, code.k)
    training = replace(training or ParityTraining(), epochs=(training or ParityTraining()).epochs_for("user"))
    began = time.perf_counter()
    module, logits = _train(repo, code, deployed, split, encoder, training)
    train_s = time.perf_counter() - began
    measured = replace(
        measure_degraded(code, encoder, module, logits, split), default=1.0 / deployed.num_classes
    )
    stored: dict[str, VariantConfig] = {}

    def write(target: Path) -> None:
        stored["config"] = _store(target, code, deployed, module, measured, parity_format, split, data_file)

    install_variant(repo, code.parity_family, code.parity_variant, write)
    if profile:
        profile_variant(repo, code.parity_family, code.parity_variant, settings, device)
    assert training.epochs is not None
    return ParityResult(code, measured, train_s, training.epochs, stored["config"].weights_sha256, profile)


def _deployed(repo: ModelRepository, code: ParityCode) -> VariantConfig:
    if code.family.endswith(PARITY_SUFFIX):
        raise ConfigError(f"{code.family}/{code.variant} is itself a parity model")
    deployed = repo.config(code.family, code.variant)
    if deployed.model_format == "builtin":
        raise ConfigError(
            f"{code.family}/{code.variant} is one of the zoo's own models: train its parity model "
            "without --data (on the digits it was trained on)"
        )
    first = deployed.inputs[0] if deployed.inputs else None
    if first is None or len(deployed.inputs) > 1 or first.datatype != "FP32":
        raise ConfigError(
            f"{code.family}/{code.variant}: parity models are trained for a model of one FP32 input "
            f"(ParM encodes queries by adding them); it takes "
            f"{', '.join(t.describe() for t in deployed.inputs)}"
        )
    return deployed


def _split(path: Path, deployed: VariantConfig, k: int) -> DigitsSplit:
    """The user's inputs (and labels, or -1 where there are none), in a seeded 80/20 split."""
    from failsoft.zoo.samples import _numpy

    arrays = _numpy(path)
    name = deployed.inputs[0].name
    key = next((k for k in (name, *INPUT_KEYS) if k in arrays), None)
    if key is None:
        raise ConfigError(
            f"{str(path)!r} has arrays {sorted(arrays)}; none is named {name!r}, 'x' or 'inputs'"
        )
    x = np.asarray(arrays[key])
    if x.dtype.kind not in "fiu" or tuple(x.shape[1:]) != deployed.input_shape:
        raise ConfigError(
            f"{str(path)!r}: inputs of shape {list(x.shape)} ({x.dtype}); "
            f"{deployed.family}/{deployed.variant} takes [N, {', '.join(map(str, deployed.input_shape))}]"
        )
    labels = next((arrays[k] for k in LABEL_KEYS if k in arrays), None)
    y = np.full(len(x), -1, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
    if len(y) != len(x):
        raise ConfigError(f"{str(path)!r} holds {len(x)} inputs and {len(y)} labels")
    n_test = int(len(x) * TEST_FRACTION)
    if n_test < k or len(x) - n_test < k:
        raise ConfigError(
            f"{str(path)!r} holds {len(x)} inputs: too few for groups of k={k} to train and test on"
        )
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    x = x.astype(np.float32)
    test, train = order[:n_test], order[n_test:]
    return DigitsSplit(x[train], y[train], x[test], y[test])


def _train(
    repo: ModelRepository,
    code: ParityCode,
    deployed: VariantConfig,
    split: DigitsSplit,
    encoder: Any,
    training: ParityTraining,
) -> tuple[torch.nn.Module, np.ndarray]:
    """The trained parity module and the deployed outputs on the held-out inputs (whose missing labels
    become the deployed model's answers)."""
    import torch

    from failsoft.zoo.train import deterministic

    with repo.load(code.family, code.variant, device="cpu") as model:
        train_logits, test_logits = (_predict(model, x) for x in (split.x_train, split.x_test))
    if (split.y_test < 0).any():  # no labels: score against the deployed model's own answers
        split.y_test[:] = test_logits.argmax(axis=1)
    seed = training.seed + code.index
    assert training.epochs is not None
    with deterministic(seed):
        module = parity_network(deployed.input_shape, deployed.num_classes)
        _paper_init(module)
        opt = torch.optim.Adam(module.parameters(), lr=training.lr, weight_decay=training.weight_decay)
        gen = np.random.default_rng(seed)
        per_batch = training.groups_per_batch(code.k)
        module.train()
        for _ in range(training.epochs):
            x, y = _epoch(encoder, code, split.x_train, train_logits, gen)
            for start in range(0, len(x), per_batch):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(
                    module(x[start : start + per_batch]), y[start : start + per_batch]
                )
                loss.backward()
                opt.step()
        module.eval()
    return module, test_logits


def _predict(model: Any, x: np.ndarray) -> np.ndarray:
    return np.concatenate([model.predict(x[i : i + PREDICT_ROWS]) for i in range(0, len(x), PREDICT_ROWS)])


def parity_network(input_shape: tuple[int, ...], classes: int) -> torch.nn.Module:
    """ParM's MNIST parity architecture over a flattened query: two hidden ReLU layers."""
    from torch import nn

    width = int(np.prod(input_shape))
    layers: list[nn.Module] = [nn.Flatten()]
    for hidden in HIDDEN:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def _store(
    target: Path,
    code: ParityCode,
    deployed: VariantConfig,
    module: torch.nn.Module,
    measured: Any,
    parity_format: str,
    split: DigitsSplit,
    data_file: Path,
) -> VariantConfig:
    """The parity model exported as ``parity_format``, its config.json (a user-format variant with
    the ``parity`` block) and a sample of parity queries for the profiler."""
    import torch

    from failsoft.zoo.add import artefact_hash
    from failsoft.zoo.formats.examples import export_onnx, export_pt2
    from failsoft.zoo.formats.model import SAMPLE_FILE
    from failsoft.zoo.formats.registry import open_handler
    from failsoft.zoo.network import file_sha256

    target.mkdir(parents=True, exist_ok=True)
    name = deployed.inputs[0].name
    artefact = target / f"model.{parity_format}"
    example = torch.from_numpy(np.ascontiguousarray(split.x_train[:2]))
    if parity_format == "onnx":
        export_onnx(module, example, artefact, name)
    else:
        export_pt2(module, example, artefact)
    size, sha = artefact_hash(artefact)
    detail = {
        "degraded": measured.degraded,
        "deployed": measured.deployed,
        "default": measured.default,
        "reconstruction": measured.reconstruction,
        "groups": measured.groups,
        "metric": "degraded-mode top-1 on a held-out fifth of the user's data "
        "(its labels, or the deployed model's answers where it has none)",
        "data_file": data_file.name,
        "data_sha256": file_sha256(data_file),
        "architecture": {"flatten_mlp": list(HIDDEN)},
    }
    fmt: ModelFormat = "onnx" if parity_format == "onnx" else "pt2"
    handler = open_handler(fmt, artefact, {})
    signature = handler.load("cpu")  # the exported model's own tensor names
    handler.close()
    config = VariantConfig(
        code.parity_family, code.parity_variant, "user", {"flatten_mlp": list(HIDDEN)}, deployed.input_shape,
        deployed.num_classes, sum(p.numel() for p in module.parameters()), size, sha,
        Accuracy(measured.degraded, "measured", detail), model_format=fmt,
        inputs=tuple(TensorSpec(t.name, t.datatype, deployed.input_shape) for t in signature.inputs),
        outputs=signature.outputs, weights_file=artefact.name, labels=deployed.labels,
    )  # fmt: skip
    write_json(target / CONFIG_FILE, config.to_dict() | {"parity": parity_block(code, deployed)})
    np.save(target / SAMPLE_FILE, split.x_test[: max(code.k, 4)], allow_pickle=False)
    return config
