"""A small, real model repository for tests (any area's) and quick experiments; no pytest needed.

:func:`build_tiny_zoo` builds the ``digits_mlp`` family (4 trained variants, the same names and
weights the demo zoo has) and profiles it with :data:`~failsoft.zoo.profiler.QUICK` settings: fewer
loads and batch sizes, so the whole thing takes seconds. It is idempotent, so a session-scoped
fixture can call it once per test run::

    @pytest.fixture(scope="session")
    def tiny_zoo(tmp_path_factory):
        return build_tiny_zoo(tmp_path_factory.mktemp("zoo"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from failsoft.zoo.profiler import QUICK
from failsoft.zoo.repository import ModelRepository

TINY_FAMILIES: tuple[str, ...] = ("digits_mlp",)


def build_tiny_zoo(out: str | Path, families: Sequence[str] = TINY_FAMILIES) -> ModelRepository:
    """Build and quickly profile ``families`` (default: ``digits_mlp``) into ``out``."""
    from failsoft.zoo.build import build_zoo

    return build_zoo(out, families=list(families), settings=QUICK, device="cpu")
