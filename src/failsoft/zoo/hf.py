"""The one wrapper around ``transformers``: ImageNet architectures built from their configs.

Nothing can be downloaded here, and there is no torchvision, so the ImageNet families of the zoo are
``transformers`` image classifiers built with ``from_config`` and randomly initialised. Their configs
carry the layer counts and widths of the published variants, so parameter counts (checked against
torchvision's in the tests), weight bytes, memory, load times and latencies are those of the real
models (FailLite section 2.4, Fig. 2b: load time grows with memory). Only their accuracy is not
theirs to measure: it is the published ImageNet top-1, recorded as *declared*.

A variant is rebuilt from the config dict stored in its ``config.json``. Loading builds the module on
PyTorch's ``meta`` device (no memory, no random init) and then assigns the safetensors weights, so a
cold load costs reading the weights, not initialising them twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

IMAGENET_CLASSES = 1000


def model_from_config(config: dict[str, Any], on_meta: bool = False) -> torch.nn.Module:
    """An image classifier from a stored config dict (``model_type`` picks the architecture)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageClassification

    data = dict(config)
    model_type = data.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **data)
    if on_meta:
        with torch.device("meta"):
            return AutoModelForImageClassification.from_config(cfg)
    return AutoModelForImageClassification.from_config(cfg)


def forward_logits(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(pixel_values=x).logits


def import_model_class(config: dict[str, Any]) -> None:
    """Import the modeling code a config needs, so that a memory probe does not count the import."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING

    data = dict(config)
    cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    _ = MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING[type(cfg)]


_NOT_STORED = ("id2label", "label2id", "transformers_version")


def config_to_dict(config: Any) -> dict[str, Any]:
    """The JSON-able dict a config is stored as: the fields that differ from its defaults."""
    diff = {k: v for k, v in config.to_diff_dict().items() if k not in _NOT_STORED}
    return diff | {"model_type": config.model_type, "num_labels": config.num_labels}


# ----------------------------------------------------------------------------------------------
# Published architectures (the torchvision variants whose ImageNet top-1 the zoo declares).
# ----------------------------------------------------------------------------------------------
# transformers 5 declares its configs as dataclasses without ``num_labels``, which they still take
# (PretrainedConfig's keyword): hence the ``type: ignore[call-arg]`` on each constructor below.


def resnet(depths: list[int], bottleneck: bool) -> dict[str, Any]:
    """ResNet (He et al. 2016): basic blocks for 18/34, bottlenecks (4x expansion) for 50/101/152."""
    from transformers import ResNetConfig

    widths = [256, 512, 1024, 2048] if bottleneck else [64, 128, 256, 512]
    cfg = ResNetConfig(  # type: ignore[call-arg]
        layer_type="bottleneck" if bottleneck else "basic",
        depths=depths,
        hidden_sizes=widths,
        num_labels=IMAGENET_CLASSES,
    )
    return config_to_dict(cfg) | {"image_size": 224}


def convnext(depths: list[int], widths: list[int]) -> dict[str, Any]:
    """ConvNeXt (Liu et al. 2022) tiny/small/base/large."""
    from transformers import ConvNextConfig

    cfg = ConvNextConfig(depths=depths, hidden_sizes=widths, num_labels=IMAGENET_CLASSES)  # type: ignore[call-arg]
    return config_to_dict(cfg)


def efficientnet(width: float, depth: float, resolution: int, dropout: float) -> dict[str, Any]:
    """EfficientNet-B0..B7 (Tan & Le 2019): compound scaling of width, depth and input resolution."""
    from transformers import EfficientNetConfig

    cfg = EfficientNetConfig(  # type: ignore[call-arg]
        width_coefficient=width,
        depth_coefficient=depth,
        image_size=resolution,
        dropout_rate=dropout,
        hidden_dim=_round_filters(1280, width),
        num_labels=IMAGENET_CLASSES,
    )
    return config_to_dict(cfg)


def regnet_y(widths: list[int], depths: list[int], group_width: int) -> dict[str, Any]:
    """RegNetY (Radosavovic et al. 2020): stage widths and depths of torchvision's regnet_y_*."""
    from transformers import RegNetConfig

    cfg = RegNetConfig(  # type: ignore[call-arg]
        layer_type="y",
        hidden_sizes=widths,
        depths=depths,
        groups_width=group_width,
        num_labels=IMAGENET_CLASSES,
    )
    return config_to_dict(cfg) | {"image_size": 224}


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """EfficientNet's channel rounding: scale by ``width`` to a multiple of 8, never below 90 %."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return rounded


def input_side(config: dict[str, Any]) -> int:
    """The square input side the variant was published at (224 unless the config says otherwise)."""
    return int(config.get("image_size", 224))
