"""The families the zoo knows how to build, and which of them the default demo zoo contains.

Two kinds of family (FailLite section 2.4: variants of one family trade accuracy for size):

* **trained** here on scikit-learn's digits (``digits_mlp``, ``digits_cnn``): 4 variants each, of
  growing depth and width, trained with fixed seeds on a fixed split; accuracy *measured* on the
  held-out images. These are the models the demo and the tests serve.
* **stateful**, trained here (``sp500_gru``, ``digits_online``): models whose answers depend on the
  requests before them (HAMS's stateful models, :mod:`failsoft.zoo.stateful`); opt-in.
* **declared**, ImageNet-style (``resnet``, ``convnext``, ``efficientnet``, ``regnet``): the published
  torchvision variants rebuilt from ``transformers`` configs with their real layer counts and widths,
  randomly initialised (nothing is downloaded). Their sizes, load times and latencies are real;
  their accuracy is torchvision's published ImageNet top-1, recorded as *declared* with its source.

A build selector is a family name (every variant) or ``family/variant``. The default build keeps
to what two cores build and profile in well under three minutes; the large ImageNet families
(up to ConvNeXt-Large's 754 MB) are opt-in.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from failsoft.errors import ConfigError, RepositoryError
from failsoft.zoo import hf
from failsoft.zoo.layout import STATEFUL_ARCHES, Arch
from failsoft.zoo.repository import ModelRepository
from failsoft.zoo.stateful import sp500_architecture
from failsoft.zoo.train import Training

ACCURACY_CSV = "torchvision_imagenet_accuracy.csv"
ACCURACY_SOURCE = (
    "torchvision 0.29.2 weight metadata (ImageNet-1K top-1), "
    "failsoft/data/profiles/torchvision_imagenet_accuracy.csv"
)


@dataclass(frozen=True)
class VariantSpec:
    """One variant to build. ``architecture`` makes the config dict (it may import transformers)."""

    name: str
    arch: Arch
    architecture: Callable[[], dict[str, Any]]
    training: Training | None = None  # None: randomly initialised, accuracy declared
    published_as: str | None = None  # the torchvision name whose published accuracy is declared

    @property
    def stateful(self) -> bool:
        """Whether the variant keeps state across requests (``failsoft.zoo.stateful``)."""
        return self.arch in STATEFUL_ARCHES


@dataclass(frozen=True)
class FamilySpec:
    name: str
    kind: Literal["trained", "declared", "stateful"]
    description: str
    variants: tuple[VariantSpec, ...] = field(default_factory=tuple)

    def variant(self, name: str) -> VariantSpec:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.variants)
        raise ConfigError(f"family {self.name!r} has no variant {name!r} (known: {known})")


def _const(value: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    return lambda: dict(value)


def _mlp(name: str, hidden: list[int], epochs: int) -> VariantSpec:
    return VariantSpec(name, "digits_mlp", _const({"hidden": hidden}), Training(epochs=epochs))


def _cnn(name: str, channels: list[int], fc: int, epochs: int) -> VariantSpec:
    return VariantSpec(name, "digits_cnn", _const({"channels": channels, "fc": fc}), Training(epochs=epochs))


def _gru(name: str, hidden: int, inputs: int = 1) -> VariantSpec:
    make = partial(sp500_architecture, hidden, inputs)
    return VariantSpec(name, "sp500_gru", make, Training(epochs=20, lr=1e-2))


def _online(name: str, hidden: list[int]) -> VariantSpec:
    arch = {"hidden": hidden, "pretrain_images": 200, "online_lr": 0.05}
    return VariantSpec(name, "digits_online", _const(arch), Training(epochs=15))


def _tv(name: str, make: Callable[[], dict[str, Any]]) -> VariantSpec:
    return VariantSpec(name, "transformers", make, None, published_as=name)


FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec(
        "digits_mlp",
        "trained",
        "multilayer perceptrons on 8x8 digits, 1 to 3 hidden layers",
        (
            _mlp("mlp_xs", [8], 15),
            _mlp("mlp_s", [32], 15),
            _mlp("mlp_m", [128, 128], 15),
            _mlp("mlp_l", [1024, 1024, 1024], 10),
        ),
    ),
    FamilySpec(
        "digits_cnn",
        "trained",
        "small CNNs on 8x8 digits (the input reshaped to 1x8x8), 1 to 3 conv layers",
        (
            _cnn("cnn_xs", [2], 0, 15),
            _cnn("cnn_s", [8, 16], 32, 15),
            _cnn("cnn_m", [16, 32, 64], 128, 15),
            _cnn("cnn_l", [32, 64, 128], 2048, 10),
        ),
    ),
    FamilySpec(
        "sp500_gru",
        "stateful",
        "stateful: a GRU predicting the next value of HAMS's SP500 series; its hidden state is carried "
        "across requests",
        (_gru("gru_16", 16), _gru("gru_64", 64)),
    ),
    FamilySpec(
        "sp500_gru2",
        "stateful",
        "stateful: the SP500 GRU reading two values per request (the current value and the one before "
        "it): a fan-in of two one-value nodes (HAMS's reduce) feeds it; its own family, since its input "
        "differs from sp500_gru's",
        (_gru("gru_16_x2", 16, inputs=2),),
    ),
    FamilySpec(
        "digits_online",
        "stateful",
        "stateful: a digits classifier whose head learns from every labelled request (one SGD step); "
        "its head's weights are its state",
        (_online("logreg", []), _online("mlp_head", [32])),
    ),
    FamilySpec(
        "resnet",
        "declared",
        "ResNet-18/34/50/101/152 (transformers ResNetConfig, random init)",
        (
            _tv("resnet18", partial(hf.resnet, [2, 2, 2, 2], False)),
            _tv("resnet34", partial(hf.resnet, [3, 4, 6, 3], False)),
            _tv("resnet50", partial(hf.resnet, [3, 4, 6, 3], True)),
            _tv("resnet101", partial(hf.resnet, [3, 4, 23, 3], True)),
            _tv("resnet152", partial(hf.resnet, [3, 8, 36, 3], True)),
        ),
    ),
    FamilySpec(
        "convnext",
        "declared",
        "ConvNeXt tiny/small/base/large (transformers ConvNextConfig, random init)",
        (
            _tv("convnext_tiny", partial(hf.convnext, [3, 3, 9, 3], [96, 192, 384, 768])),
            _tv("convnext_small", partial(hf.convnext, [3, 3, 27, 3], [96, 192, 384, 768])),
            _tv("convnext_base", partial(hf.convnext, [3, 3, 27, 3], [128, 256, 512, 1024])),
            _tv("convnext_large", partial(hf.convnext, [3, 3, 27, 3], [192, 384, 768, 1536])),
        ),
    ),
    FamilySpec(
        "efficientnet",
        "declared",
        "EfficientNet-B0..B7 (transformers EfficientNetConfig, random init; input 224..600 px)",
        tuple(
            _tv(f"efficientnet_b{i}", partial(hf.efficientnet, w, d, r, p))
            for i, (w, d, r, p) in enumerate(
                [
                    (1.0, 1.0, 224, 0.2),
                    (1.0, 1.1, 240, 0.2),
                    (1.1, 1.2, 260, 0.3),
                    (1.2, 1.4, 300, 0.3),
                    (1.4, 1.8, 380, 0.4),
                    (1.6, 2.2, 456, 0.4),
                    (1.8, 2.6, 528, 0.5),
                    (2.0, 3.1, 600, 0.5),
                ]
            )
        ),
    ),
    FamilySpec(
        "regnet",
        "declared",
        "RegNetY 400MF..32GF (transformers RegNetConfig, random init)",
        (
            _tv("regnet_y_400mf", partial(hf.regnet_y, [48, 104, 208, 440], [1, 3, 6, 6], 8)),
            _tv("regnet_y_800mf", partial(hf.regnet_y, [64, 144, 320, 784], [1, 3, 8, 2], 16)),
            _tv("regnet_y_1_6gf", partial(hf.regnet_y, [48, 120, 336, 888], [2, 6, 17, 2], 24)),
            _tv("regnet_y_3_2gf", partial(hf.regnet_y, [72, 216, 576, 1512], [2, 5, 13, 1], 24)),
            _tv("regnet_y_8gf", partial(hf.regnet_y, [224, 448, 896, 2016], [2, 4, 10, 1], 56)),
            _tv("regnet_y_16gf", partial(hf.regnet_y, [224, 448, 1232, 3024], [2, 4, 11, 1], 112)),
            _tv("regnet_y_32gf", partial(hf.regnet_y, [232, 696, 1392, 3712], [2, 5, 12, 1], 232)),
        ),
    ),
)

# What ``failsoft zoo build`` builds without --families: the two trained digits families (what the
# demo serves) and the three smallest ResNets, so the table shows real ImageNet sizes too.
DEFAULT_BUILD: tuple[str, ...] = (
    "digits_mlp",
    "digits_cnn",
    "resnet/resnet18",
    "resnet/resnet34",
    "resnet/resnet50",
)


def family_spec(name: str) -> FamilySpec:
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    known = ", ".join(f.name for f in FAMILIES)
    raise ConfigError(f"unknown zoo family {name!r} (known: {known})")


def exposes_state(family: str, variant: str | None, repository: Path | None = None) -> bool:
    """Whether ``family/variant`` is a stateful model (``state()``/``apply_state()``).

    With no variant (the deployment picks one), every variant of the family must be. A variant built
    in ``repository`` answers from its ``config.json``; otherwise the zoo's catalog answers, and a
    family it does not know exposes no state.
    """
    if repository is not None:
        repo = ModelRepository(repository)
        try:
            built = [variant] if variant else repo.variant_names(family)
            if built and all(repo.config(family, v).stateful for v in built):
                return True
        except RepositoryError:
            pass
    try:
        spec = family_spec(family)
        chosen = [spec.variant(variant)] if variant else list(spec.variants)
    except ConfigError:
        return False
    return all(v.stateful for v in chosen)


def select(selectors: Iterable[str] | None = None) -> list[tuple[FamilySpec, VariantSpec]]:
    """The variants that ``family`` or ``family/variant`` selectors name, in catalog order, once each."""
    chosen: set[tuple[str, str]] = set()
    for sel in DEFAULT_BUILD if selectors is None else selectors:
        fam_name, _, var_name = sel.strip().partition("/")
        fam = family_spec(fam_name)
        names = [fam.variant(var_name).name] if var_name else [v.name for v in fam.variants]
        chosen.update((fam.name, n) for n in names)
    if not chosen:
        raise ConfigError("no zoo family selected")
    return [(f, v) for f in FAMILIES for v in f.variants if (f.name, v.name) in chosen]


@dataclass(frozen=True)
class Published:
    """A torchvision variant's published ImageNet numbers (from the bundled CSV)."""

    name: str
    top1: float  # percent
    num_params: int
    weights_file_size_mb: float


def accuracy_csv_path() -> Path:
    return Path(str(resources.files("failsoft") / "data" / "profiles" / ACCURACY_CSV))


@cache
def published() -> dict[str, Published]:
    """torchvision's declared ImageNet top-1 and parameter counts, by variant name."""
    path = accuracy_csv_path()
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    return {
        r["model_variant"]: Published(
            r["model_variant"],
            float(r["imagenet_top1"]),
            int(r["num_params"]),
            float(r["weights_file_size_mb"]),
        )
        for r in rows
    }


def declared_accuracy(spec: VariantSpec) -> tuple[float, dict[str, Any]]:
    """Published top-1 in [0, 1] and its provenance, for a declared variant."""
    name = spec.published_as or spec.name
    pub = published().get(name)
    if pub is None:
        raise ConfigError(f"no published accuracy for {name!r} in {ACCURACY_CSV}")
    return round(pub.top1 / 100.0, 6), {
        "source": ACCURACY_SOURCE,
        "torchvision_variant": name,
        "top1_pct": pub.top1,
    }


def selectors_of(pairs: Sequence[tuple[FamilySpec, VariantSpec]]) -> list[str]:
    return [f"{f.name}/{v.name}" for f, v in pairs]
