"""Parity models (ParM sections 4.3-4.4 and 5), trained here and stored like any variant.

A parity model has the deployed variant's architecture (section 4.3) and is trained from scratch so
that, on a parity query ``P_p`` built by the encoder from k queries, it outputs the (coded) sum of
the deployed model's outputs on those queries, ``sum_i G[p, i] F(X_i)`` (``G`` is
:func:`~failsoft.policies.coding.interface.code_matrix`; for r = 1 the plain sum). Training
(section 4.4): every epoch the deployed model's training split is shuffled and cut into groups of k
("k samples drawn at random from the deployed model's training dataset"), each group is encoded
with the same pure encoder the gateway uses, the targets are the deployed model's output logits
(computed once, as the public code caches them), and the loss is the MSE between the parity model's
output and the target.

Hyper-parameters, from the public training configs (``train/config/mnist-{add,concat}.json`` and
``train.py:get_config`` of github.com/Thesys-lab/parity-models, Apache-2.0; paper section 5.1):
Adam, learning rate 1e-3, L2 weight decay 1e-5; minibatches of 64 coding groups for k = 2 and 32
for k > 2; linear weights drawn from N(0, 0.01), convolutions Xavier-uniform with the ReLU gain,
biases zero. The configs train for 500 epochs (MNIST, 60 000 images); the digits training split is
1437 images (718 groups of two per epoch, 12 optimiser steps), and failsoft scales the epochs down
to :data:`DEFAULT_EPOCHS` (300 for the MLPs, 100 for the CNNs, whose epochs cost more), which keeps
one parity model of the small and medium digits variants under about a minute on one core; the
large ones (``mlp_l``, ``cnn_l``) take several minutes at these defaults (``--epochs`` sets fewer).
Training is deterministic (:func:`failsoft.zoo.train.deterministic`, seed ``seed + index``). The
public code keeps the epoch with the best validation reconstruction; failsoft keeps the last (the
digits split is too small to hold out a validation set as well). With so few steps, learning rate
1e-3 is what limits accuracy: the public code takes about 470 000 steps on MNIST, failsoft's
defaults 3600 (MLP) or 1200 (CNN); ``--lr`` is left at the config's value by default.

**Degraded-mode accuracy** (section 5): the 360 held-out images are placed, by a seeded permutation,
into groups of k; for every group the parity model answers its parity query, and every member is
decoded in turn as if it alone were unavailable (from this parity model and the other k-1 deployed
outputs); accuracy is decoded argmax == label. Beside it: the deployed model's own accuracy, the
*default-prediction* lower bound (a random output: 1 / classes, section 5.2.1), and the
reconstruction rate (decoded argmax == the deployed model's argmax, the public code's
``reconstruction_top1``).

Storage: family ``<family>_parity``, variant ``<variant>_<encoder>_k<k>_r<r>_p<index>``, with the
digits architecture in ``config.json`` (so agents load and profile it like any variant, and its
``accuracy`` is the measured degraded accuracy) plus a ``parity`` block naming the deployed
family/variant, k, r, encoder, index and the sha256 of the deployed weights, so that
:func:`check_parity` refuses a parity model trained for another variant, k, r or encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.policies.coding.interface import Encoder, check_code
from failsoft.policies.registry import get_decoder, get_encoder
from failsoft.zoo.digits import DIGITS_CLASSES, DigitsSplit, load_digits_split
from failsoft.zoo.layout import CONFIG_FILE, Accuracy, VariantConfig, read_json, write_json
from failsoft.zoo.repository import ModelRepository

if TYPE_CHECKING:
    import torch

    from failsoft.zoo.profiler import ProfileSettings

PARITY_SUFFIX = "_parity"
DEFAULT_EPOCHS: dict[str, int] = {"digits_mlp": 300, "digits_cnn": 100}  # scaled down from 500; see above
GROUP_SEED = 0  # the permutation that groups the held-out images
SOURCE = (
    "github.com/Thesys-lab/parity-models train/config/mnist-{add,concat}.json and train.py:get_config "
    "(Adam lr 1e-3, weight decay 1e-5, 64 groups per batch for k=2, 32 for k>2; 500 epochs on MNIST)"
)


@dataclass(frozen=True)
class ParityTraining:
    """How a parity model is trained (see the module docstring for where each value comes from)."""

    epochs: int | None = None  # None: DEFAULT_EPOCHS of the deployed architecture
    lr: float = 1e-3
    weight_decay: float = 1e-5
    batch_groups: int | None = None  # None: 64 for k = 2, 32 for k > 2
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.epochs is not None and self.epochs < 1) or self.lr <= 0 or self.weight_decay < 0:
            raise ConfigError(
                "parity training needs epochs >= 1, lr > 0 and weight_decay >= 0; got "
                f"epochs={self.epochs!r}, lr={self.lr!r}, weight_decay={self.weight_decay!r}"
            )
        if self.batch_groups is not None and self.batch_groups < 1:
            raise ConfigError(f"batch_groups must be >= 1; got {self.batch_groups!r}")

    def epochs_for(self, arch: str) -> int:
        return self.epochs or DEFAULT_EPOCHS.get(arch, max(DEFAULT_EPOCHS.values()))

    def groups_per_batch(self, k: int) -> int:
        return self.batch_groups or (64 if k == 2 else 32)


@dataclass(frozen=True)
class ParityCode:
    """Which parity model: the deployed variant, the code (k, r, encoder) and the parity index."""

    family: str
    variant: str
    k: int
    r: int = 1
    encoder: str = "add"
    index: int = 0

    def __post_init__(self) -> None:
        check_code(self.k, self.r)
        if not 0 <= self.index < self.r:
            raise ConfigError(f"parity index must be in 0..{self.r - 1}; got {self.index!r}")

    @property
    def parity_family(self) -> str:
        return f"{self.family}{PARITY_SUFFIX}"

    @property
    def parity_variant(self) -> str:
        return f"{self.variant}_{self.encoder}_k{self.k}_r{self.r}_p{self.index}"


@dataclass(frozen=True)
class DegradedAccuracy:
    """Section 5's numbers for one parity model on the held-out split."""

    degraded: float  # decoded argmax == label
    deployed: float  # the deployed model's own top-1 (A_a)
    default: float  # a random default prediction: 1 / classes (the lower bound)
    reconstruction: float  # decoded argmax == deployed argmax
    groups: int
    decoded: int


@dataclass(frozen=True)
class ParityResult:
    """One trained and stored parity model."""

    code: ParityCode
    accuracy: DegradedAccuracy
    train_s: float
    epochs: int
    weights_sha256: str
    profiled: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.code.parity_family,
            "variant": self.code.parity_variant,
            "deployed": f"{self.code.family}/{self.code.variant}",
            "k": self.code.k,
            "r": self.code.r,
            "encoder": self.code.encoder,
            "index": self.code.index,
            "degraded_accuracy": round(self.accuracy.degraded, 4),
            "deployed_accuracy": round(self.accuracy.deployed, 4),
            "default_accuracy": round(self.accuracy.default, 4),
            "reconstruction": round(self.accuracy.reconstruction, 4),
            "decoded": self.accuracy.decoded,
            "epochs": self.epochs,
            "train_s": round(self.train_s, 1),
            "profiled": self.profiled,
        }


def train_parity(
    repo: ModelRepository,
    code: ParityCode,
    training: ParityTraining | None = None,
    profile: bool = True,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> ParityResult:
    """Train, measure and store one parity model (and profile it unless ``profile`` is False)."""
    import time

    from failsoft.zoo.build import install_variant
    from failsoft.zoo.profiler import profile_variant

    deployed = _deployed_config(repo, code)
    training = training or ParityTraining()
    epochs = training.epochs_for(deployed.arch)
    training = replace(training, epochs=epochs)
    encoder = get_encoder(code.encoder, code.k, code.r, deployed.input_shape)
    split = load_digits_split()
    began = time.perf_counter()
    module, logits = _train(repo, code, deployed, encoder, training, split)
    train_s = time.perf_counter() - began
    measured = measure_degraded(code, encoder, module, logits[1], split)
    stored: dict[str, VariantConfig] = {}

    def write(target: Path) -> None:
        stored["config"] = _store(target, code, deployed, module, measured, training)

    install_variant(repo, code.parity_family, code.parity_variant, write)
    if profile:
        profile_variant(repo, code.parity_family, code.parity_variant, settings, device)
    return ParityResult(code, measured, train_s, epochs, stored["config"].weights_sha256, profile)


def random_parity(
    repo: ModelRepository,
    code: ParityCode,
    seed: int = 0,
    profile: bool = True,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Store a parity model with the deployed architecture and *random* weights, for latency work.

    The paper's latency experiments (section 6.1) serve ResNet-18 deployed and parity models: what
    they measure is time, which a parity model's weights do not change (same architecture, same
    work). Training a ResNet-18 parity model on ImageNet is out of reach here, so, like any
    ImageNet variant of the zoo, it is built from its config with random weights (section 5.1's
    initialisation, seed ``seed + index``). Its stored accuracy is the default-prediction bound
    (1 / classes, what a decoded answer of random weights is worth), ``declared``, with
    ``random_weights: true`` in its detail and in its ``parity`` block; ``check_parity`` accepts it
    for its deployed variant, k, r, encoder and index like a trained one.
    """
    from failsoft.zoo.build import install_variant
    from failsoft.zoo.network import build_network
    from failsoft.zoo.profiler import profile_variant
    from failsoft.zoo.train import deterministic

    if code.family.endswith(PARITY_SUFFIX):
        raise ConfigError(f"{code.family}/{code.variant} is itself a parity model")
    deployed = repo.config(code.family, code.variant)
    get_encoder(code.encoder, code.k, code.r, deployed.input_shape)  # the encoder fits the input
    with deterministic(seed + code.index):
        module, _ = build_network(deployed)
        _paper_init(module)
    module.eval()
    default = 1.0 / max(deployed.num_classes, 1)
    accuracy = Accuracy(
        default,
        "declared",
        {
            "metric": "random weights for latency work (paper 6.1): the default bound, 1 / classes",
            "random_weights": True,
            "seed": seed + code.index,
        },
    )
    stored: dict[str, VariantConfig] = {}

    def write(target: Path) -> None:
        stored["config"] = _store_module(target, code, deployed, module, accuracy, random_weights=True)

    install_variant(repo, code.parity_family, code.parity_variant, write)
    if profile:
        profile_variant(repo, code.parity_family, code.parity_variant, settings, device)
    return {
        "family": code.parity_family,
        "variant": code.parity_variant,
        "deployed": f"{code.family}/{code.variant}",
        "k": code.k,
        "r": code.r,
        "encoder": code.encoder,
        "index": code.index,
        "random_weights": True,
        "parameters": stored["config"].parameters,
        "default_accuracy": round(default, 4),
        "profiled": profile,
    }


def _deployed_config(repo: ModelRepository, code: ParityCode) -> VariantConfig:
    deployed = repo.config(code.family, code.variant)
    if deployed.arch not in ("digits_mlp", "digits_cnn"):
        raise ConfigError(
            f"parity models are trained on the digits families; {code.family}/{code.variant} is "
            f"{deployed.arch!r}: train it on your own inputs (failsoft parity train ... --data FILE.npz), "
            "or store a random-weight parity model for latency work (--random-weights)"
        )
    if code.family.endswith(PARITY_SUFFIX):
        raise ConfigError(f"{code.family}/{code.variant} is itself a parity model")
    return deployed


def _train(
    repo: ModelRepository,
    code: ParityCode,
    deployed: VariantConfig,
    encoder: Encoder,
    training: ParityTraining,
    split: DigitsSplit,
) -> tuple[torch.nn.Module, tuple[np.ndarray, np.ndarray]]:
    """The trained parity module, and the deployed logits on the (train, test) images."""
    import torch

    from failsoft.zoo.network import build_network
    from failsoft.zoo.train import deterministic

    with repo.load(code.family, code.variant, device="cpu") as model:
        logits = (model.predict(np.array(split.x_train)), model.predict(np.array(split.x_test)))
    seed = training.seed + code.index
    with deterministic(seed):
        module, _ = build_network(deployed)
        _paper_init(module)
        opt = torch.optim.Adam(module.parameters(), lr=training.lr, weight_decay=training.weight_decay)
        gen = np.random.default_rng(seed)
        per_batch = training.groups_per_batch(code.k)
        module.train()
        for _ in range(training.epochs_for(deployed.arch)):
            x, y = _epoch(encoder, code, split.x_train, logits[0], gen)
            for start in range(0, len(x), per_batch):
                opt.zero_grad(set_to_none=True)
                out = module(x[start : start + per_batch])
                torch.nn.functional.mse_loss(out, y[start : start + per_batch]).backward()
                opt.step()
        module.eval()
    return module, logits


def _epoch(
    encoder: Encoder, code: ParityCode, x: np.ndarray, logits: np.ndarray, gen: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch of training pairs: the images shuffled into groups of k, encoded, and their targets."""
    import torch

    groups = len(x) // code.k
    idx = gen.permutation(len(x))[: groups * code.k].reshape(groups, code.k)
    parity = encoder.encode([x[idx[:, i]] for i in range(code.k)])[code.index]
    target = encoder.parity_target(np.stack([logits[idx[:, i]] for i in range(code.k)]), code.index)
    return torch.from_numpy(np.ascontiguousarray(parity)), torch.from_numpy(target)


def _paper_init(module: torch.nn.Module) -> None:
    """Section 5.1: convolutions Xavier-uniform (ReLU gain), other weights N(0, 0.01), biases zero."""
    from torch import nn

    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.xavier_uniform_(m.weight, gain=nn.init.calculate_gain("relu"))
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def measure_degraded(
    code: ParityCode,
    encoder: Encoder,
    module: torch.nn.Module,
    test_logits: np.ndarray,
    split: DigitsSplit | None = None,
) -> DegradedAccuracy:
    """Degraded-mode accuracy of one parity model on the held-out split (section 5; see above)."""
    import torch

    split = split or load_digits_split()
    idx = _test_groups(code.k, len(split.y_test))
    parity = encoder.encode([split.x_test[idx[:, i]] for i in range(code.k)])[code.index]
    with torch.inference_mode():
        out = module(torch.from_numpy(np.ascontiguousarray(parity))).numpy()
    erasures = [(j,) for j in range(code.k)]
    return _score(code.k, code.r, idx, test_logits, {code.index: out}, erasures, split)


def measure_joint(
    repo: ModelRepository, family: str, variant: str, k: int, r: int, encoder: str
) -> DegradedAccuracy:
    """Degraded accuracy with ``min(r, k)`` data members unavailable at once (section 7), decoded from
    the r stored parity models of ``family/variant`` (each checked with :func:`check_parity`)."""
    import itertools

    split = load_digits_split()
    idx = _test_groups(k, len(split.y_test))
    deployed = repo.config(family, variant)
    enc = get_encoder(encoder, k, r, deployed.input_shape)
    parities = enc.encode([split.x_test[idx[:, i]] for i in range(k)])
    outs = {}
    for p in range(r):
        code = ParityCode(family, variant, k, r, encoder, p)
        check_parity(repo, code.parity_family, code.parity_variant, code)
        with repo.load(code.parity_family, code.parity_variant, device="cpu") as model:
            outs[p] = model.predict(parities[p])
    with repo.load(family, variant, device="cpu") as model:
        logits = model.predict(np.array(split.x_test))
    erasures = list(itertools.combinations(range(k), min(r, k)))
    return _score(k, r, idx, logits, outs, erasures, split)


def _test_groups(k: int, n: int) -> np.ndarray:
    """The held-out images' indices in groups of k (a seeded permutation; the rest left out)."""
    groups = n // k
    return np.random.default_rng(GROUP_SEED).permutation(n)[: groups * k].reshape(groups, k)


def _score(
    k: int,
    r: int,
    idx: np.ndarray,
    logits: np.ndarray,
    parity_outs: dict[int, np.ndarray],
    erasures: Sequence[tuple[int, ...]],
    split: DigitsSplit,
) -> DegradedAccuracy:
    """Decode every erased member of every group from ``parity_outs`` and the other data outputs."""
    decoder = get_decoder(k, r)
    correct = agree = count = 0
    for missing in erasures:
        available = {i: logits[idx[:, i]] for i in range(k) if i not in missing}
        decoded = decoder.decode(available | {k + p: out for p, out in parity_outs.items()})
        assert decoded is not None  # as many parity outputs as erased members: k of k + r present
        for j in missing:
            guess = decoded[j].argmax(axis=1)
            correct += int((guess == split.y_test[idx[:, j]]).sum())
            agree += int((guess == logits[idx[:, j]].argmax(axis=1)).sum())
            count += len(idx)
    deployed = float((logits.argmax(axis=1) == split.y_test).mean())
    return DegradedAccuracy(correct / count, deployed, 1.0 / DIGITS_CLASSES, agree / count, len(idx), count)


def _store(
    target: Path,
    code: ParityCode,
    deployed: VariantConfig,
    module: torch.nn.Module,
    measured: DegradedAccuracy,
    training: ParityTraining,
) -> VariantConfig:
    detail = asdict(measured) | {
        "metric": "degraded-mode top-1: decoded argmax == label, each member of a group unavailable in turn",
        "n_test": len(load_digits_split().y_test),
        "group_seed": GROUP_SEED,
        "training": asdict(training) | {"groups_per_batch": training.groups_per_batch(code.k)},
        "source": SOURCE,
    }
    return _store_module(target, code, deployed, module, Accuracy(measured.degraded, "measured", detail))


def _store_module(
    target: Path,
    code: ParityCode,
    deployed: VariantConfig,
    module: torch.nn.Module,
    accuracy: Accuracy,
    random_weights: bool = False,
) -> VariantConfig:
    """Write a parity model: the deployed architecture, its weights, and the ``parity`` block."""
    from failsoft.zoo.build import store_variant
    from failsoft.zoo.catalog import FamilySpec, VariantSpec

    architecture = dict(deployed.architecture)
    kind: Literal["trained", "declared"] = "declared" if random_weights else "trained"
    fam = FamilySpec(code.parity_family, kind, f"ParM parity models of {code.family}")
    var = VariantSpec(code.parity_variant, deployed.arch, lambda: dict(architecture))
    config = store_variant(target, fam, var, module, architecture, accuracy)
    block = parity_block(code, deployed)
    if random_weights:
        block["random_weights"] = True
    write_json(target / CONFIG_FILE, config.to_dict() | {"parity": block})
    return config


def parity_block(code: ParityCode, deployed: VariantConfig) -> dict[str, Any]:
    """The ``parity`` block of a parity model's config.json: what :func:`check_parity` checks."""
    return {
        "deployed": {
            "family": code.family,
            "variant": code.variant,
            "weights_sha256": deployed.weights_sha256,
        },
        "k": code.k,
        "r": code.r,
        "encoder": code.encoder,
        "index": code.index,
        "coefficients": get_encoder(code.encoder, code.k, code.r, deployed.input_shape)
        .coefficients[code.index]
        .tolist(),
    }


class _DeployedSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    family: str
    variant: str
    weights_sha256: str = Field(pattern="^[0-9a-f]{64}$")


class _ParitySpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    deployed: _DeployedSpec
    k: int
    r: int
    encoder: Literal["add", "concat"]
    index: int = Field(ge=0)


@dataclass(frozen=True)
class ParityInfo:
    """A stored parity model's ``parity`` block: what it was trained for."""

    code: ParityCode
    deployed_sha256: str


def read_parity(repo: ModelRepository, family: str, variant: str) -> ParityInfo:
    """The ``parity`` block of a stored variant; ConfigError when it is not a parity model."""
    path = repo.variant_dir(family, variant) / CONFIG_FILE
    data = read_json(path)
    if "parity" not in data:
        raise ConfigError(f"{family}/{variant} is not a parity model (its config.json has no 'parity' block)")
    try:
        spec = _ParitySpec.model_validate(data["parity"])
        code = ParityCode(
            spec.deployed.family, spec.deployed.variant, spec.k, spec.r, spec.encoder, spec.index
        )
    except (ValidationError, ConfigError) as exc:
        raise CorruptModelError(f"{str(path)!r}: invalid parity block: {exc}") from exc
    return ParityInfo(code, spec.deployed.weights_sha256)


def check_parity(repo: ModelRepository, family: str, variant: str, expected: ParityCode) -> ParityInfo:
    """The parity model ``family/variant`` if it was trained for ``expected``, else ConfigError.

    Refused: a parity model of another deployed variant, k, r, encoder or index, and one whose
    deployed variant's weights have changed since it was trained (its targets were other outputs).
    """
    info = read_parity(repo, family, variant)
    got = info.code
    for name in ("family", "variant", "k", "r", "encoder", "index"):
        if getattr(got, name) != getattr(expected, name):
            want = expected
            raise ConfigError(
                f"parity model {family}/{variant} was trained for {got.family}/{got.variant} with "
                f"k={got.k}, r={got.r}, encoder={got.encoder!r}, index={got.index}; this group needs "
                f"{want.family}/{want.variant} with k={want.k}, r={want.r}, encoder={want.encoder!r}, "
                f"index={want.index} ({name} differs)"
            )
    current = repo.config(expected.family, expected.variant).weights_sha256
    if current != info.deployed_sha256:
        raise ConfigError(
            f"parity model {family}/{variant} was trained on {expected.family}/{expected.variant} weights "
            f"sha256 {info.deployed_sha256[:12]}..., the repository holds {current[:12]}...: train it again"
        )
    return info


def check_coded_service(repo: ModelRepository, service: Any, apps: Any) -> None:
    """A coded service's members against the repository, before anything is deployed.

    ``service`` is a :class:`~failsoft.services.Service` of mode ``coded``; ``apps`` maps member names
    to apps with ``family`` and a ``primary`` placement (``variant``). The k data members must serve
    one variant of one family, and parity member p must serve a parity model trained for that
    variant with the service's k, r and encoder, as parity index p (:func:`check_parity`).
    """
    params = service.params
    data = service.members[: params.k]
    served = {(apps[m].family, _variant_of(apps[m], service.name)) for m in data}
    if len(served) > 1:
        raise ConfigError(
            f"coded service {service.name!r}: its data members {list(data)} serve "
            f"{sorted(f'{f}/{v}' for f, v in served)}; a coding group serves one variant"
        )
    ((family, variant),) = served
    for index, member in enumerate(service.members[params.k :]):
        app = apps[member]
        code = ParityCode(family, variant, params.k, params.r, params.encoder, index)
        try:
            check_parity(repo, app.family, _variant_of(app, service.name), code)
        except (ConfigError, CorruptModelError) as exc:
            raise ConfigError(f"coded service {service.name!r}: parity member {member!r}: {exc}") from exc


def _variant_of(app: Any, service: str) -> str:
    if app.primary is None:
        raise ConfigError(
            f"coded service {service!r}: member {app.name!r} has no primary placement; a coded "
            "service's members name their server and variant"
        )
    return str(app.primary.variant)
