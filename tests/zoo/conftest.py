"""Zoo fixtures: one tiny real repository per test session (digits_mlp, quick profile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from failsoft.zoo import ModelRepository
from failsoft.zoo.testing import build_tiny_zoo


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """The digits_mlp family built and profiled once; tests must not modify it (copy it instead)."""
    return build_tiny_zoo(tmp_path_factory.mktemp("tiny-zoo"))


@pytest.fixture
def zoo_copy(tiny_zoo: ModelRepository, tmp_path: Path) -> ModelRepository:
    """A private copy of the tiny zoo that a test may break."""
    root = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, root)
    return ModelRepository(root)
