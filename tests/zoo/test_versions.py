"""Numbered model versions in a repository (Triton's layout) and the names they go by."""

from __future__ import annotations

import pytest

from failsoft.errors import ModelNotFoundError
from failsoft.versions import split_version, version_of, versioned
from failsoft.zoo import ModelRepository


def _variant(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")


def test_numbered_directories_are_versions_and_a_plain_variant_is_version_1(tmp_path):
    fam = tmp_path / "fam"
    _variant(fam / "big")
    _variant(fam / "big" / "2")
    _variant(fam / "big" / "10")
    _variant(fam / "only" / "1")
    (fam / "big" / "3").mkdir()  # no config.json: not a version
    repo = ModelRepository(tmp_path)
    assert repo.variant_names("fam") == ["big", "big@10", "big@2", "only"]
    assert repo.versions("fam", "big") == [1, 2, 10] and repo.versions("fam", "only") == [1]
    assert repo.variant_dir("fam", "big") == (fam / "big").resolve()
    assert repo.variant_dir("fam", "big@2") == (fam / "big" / "2").resolve()
    assert repo.variant_dir("fam", "only") == (fam / "only" / "1").resolve()
    for missing in ("big@3", "big@4", "small@2"):
        with pytest.raises(ModelNotFoundError, match="no variant"):
            repo.variant_dir("fam", missing)


def test_version_names_round_trip_and_bad_ones_are_refused():
    assert versioned("mlp_l", 1) == "mlp_l" and versioned("mlp_l", 2) == "mlp_l@2"
    assert split_version("mlp_l@2") == ("mlp_l", 2) and split_version("mlp_l") == ("mlp_l", None)
    assert version_of("mlp_l@7") == 7 and version_of("mlp_l") == 1
    for bad in ("mlp_l@", "mlp_l@0", "mlp_l@x", "mlp_l@²"):
        with pytest.raises(ModelNotFoundError, match="invalid version"):
            split_version(bad)
    with pytest.raises(ModelNotFoundError):
        ModelRepository("/nonexistent").variant_dir("fam", "../x@2")
