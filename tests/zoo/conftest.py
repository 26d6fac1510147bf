"""Zoo fixtures: one tiny real repository per test session (digits_mlp, quick profile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from failsoft.zoo import ModelRepository


@pytest.fixture
def zoo_copy(tiny_zoo: ModelRepository, tmp_path: Path) -> ModelRepository:
    """A private copy of the tiny zoo that a test may break."""
    root = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, root)
    return ModelRepository(root)


@pytest.fixture(scope="session")
def small_digits_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """Only digits_mlp/mlp_s, trained and not profiled: the deployed model of the parity tests."""
    from failsoft.zoo.build import build_zoo

    return build_zoo(tmp_path_factory.mktemp("small-zoo"), ["digits_mlp/mlp_s"], profile=False)


@pytest.fixture
def small_zoo_copy(small_digits_zoo: ModelRepository, tmp_path: Path) -> ModelRepository:
    """A private copy of the small zoo that a test may add parity models to, or break."""
    root = tmp_path / "small-zoo"
    shutil.copytree(small_digits_zoo.root, root)
    return ModelRepository(root)
