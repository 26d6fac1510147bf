import pytest

from failsoft.domain import Demand, Family, Variant
from failsoft.profiles import TESTBED_FAMILIES, load_profile_families, trimmed


def test_family_orders_variants_and_normalises_accuracy():
    fam = Family("f", (Variant("big", 500, 0.8, 900, 9), Variant("small", 50, 0.6, 90, 2)))
    assert [v.name for v in fam.variants] == ["small", "big"]
    assert fam.normalized_accuracy(fam.smallest) == pytest.approx(0.75)
    assert fam.normalized_accuracy(fam.largest) == 1.0
    with pytest.raises(ValueError, match="duplicate"):
        Family("g", (Variant("x", 1, 0.1, 1, 1), Variant("x", 2, 0.2, 2, 2)))


def test_demand_fits_in_every_resource():
    free = Demand(100, 0.5)
    assert Demand(100, 0.5).fits_in(free)
    assert not Demand(101, 0.1).fits_in(free)
    assert not Demand(10, 0.6).fits_in(free)
    assert (Demand(1, 1) - Demand(2, 0)).clipped() == Demand(0, 1)


def test_profile_families_are_measured_and_sorted():
    families = {f.name: f for f in load_profile_families(families=TESTBED_FAMILIES)}
    assert set(families) == set(TESTBED_FAMILIES)
    convnext = families["convnext"]
    assert [v.name for v in convnext.variants] == [
        "convnext_tiny",
        "convnext_small",
        "convnext_base",
        "convnext_large",
    ]
    assert convnext.largest.memory_mb == pytest.approx(1095.1) and convnext.largest.load_ms == pytest.approx(
        7584.5
    )
    assert all(v.accuracy_source == "declared" for v in convnext.variants)


def test_trimmed_keeps_both_ends():
    eff = next(f for f in load_profile_families(families=["efficientnet"]))
    four = trimmed(eff, 4)
    assert len(four.variants) == 4
    assert four.smallest == eff.smallest and four.largest == eff.largest
