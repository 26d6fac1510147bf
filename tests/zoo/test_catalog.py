"""The catalog: published architectures with torchvision's parameter counts, selectors, defaults."""

from __future__ import annotations

import pytest

from failsoft.errors import ConfigError
from failsoft.zoo import hf
from failsoft.zoo.catalog import (
    DEFAULT_BUILD,
    FAMILIES,
    declared_accuracy,
    family_spec,
    published,
    select,
    selectors_of,
)

DECLARED = [(f, v) for f in FAMILIES if f.kind == "declared" for v in f.variants]


@pytest.mark.parametrize(("fam", "var"), DECLARED, ids=[v.name for _, v in DECLARED])
def test_declared_variants_have_the_published_parameter_count(fam, var):
    module = hf.model_from_config(var.architecture(), on_meta=True)
    assert sum(p.numel() for p in module.parameters()) == published()[var.published_as].num_params
    accuracy, detail = declared_accuracy(var)
    assert accuracy == pytest.approx(published()[var.published_as].top1 / 100)
    assert "torchvision" in detail["source"]


def test_families_span_tens_to_hundreds_of_megabytes():
    sizes = [published()[v.published_as].weights_file_size_mb for _, v in DECLARED]
    assert min(sizes) < 20 and max(sizes) > 700
    assert len({f.name for f, _ in DECLARED}) >= 3
    trained = [f for f in FAMILIES if f.kind == "trained"]
    assert [f.name for f in trained] == ["digits_mlp", "digits_cnn"]
    assert all(len(f.variants) >= 4 for f in trained)


def test_selectors_pick_families_or_single_variants_in_catalog_order():
    picked = selectors_of(select(["resnet/resnet50", "digits_mlp", "resnet/resnet18", "digits_mlp/mlp_s"]))
    assert picked == [
        "digits_mlp/mlp_xs",
        "digits_mlp/mlp_s",
        "digits_mlp/mlp_m",
        "digits_mlp/mlp_l",
        "resnet/resnet18",
        "resnet/resnet50",
    ]
    assert selectors_of(select(None)) == selectors_of(select(DEFAULT_BUILD))


@pytest.mark.parametrize("selector", ["nope", "resnet/resnet9000", ""])
def test_unknown_selectors_are_refused(selector):
    with pytest.raises(ConfigError):
        select([selector])


def test_family_spec_names_the_known_families():
    with pytest.raises(ConfigError, match="known: digits_mlp"):
        family_spec("vgg")
