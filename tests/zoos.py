"""Tiny zoos built once per test run, however many xdist workers and test files ask for them.

Building and profiling a family takes seconds to tens of seconds (``digits_mlp`` about 20 s), and
several files need the same families (``digits_mlp`` everywhere, ``sp500_gru`` in four files), each
on its own xdist worker. So each family is built once per run into a directory every worker of the
run sees (the run's base temporary directory), under a file lock: a worker that finds another one
building waits for it rather than building it again. A repository of several families is the
families' directories copied side by side, made once per run too, and checked by
:func:`~failsoft.zoo.testing.build_tiny_zoo` (which only checks what is already built). Tests must
not modify a repository they get (copy it instead): other files may use the same one.

``$FAILSOFT_TEST_ZOO`` may name a directory that keeps them between runs: they go in
``$FAILSOFT_TEST_ZOO-shared``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from filelock import FileLock

from failsoft.zoo import ModelRepository
from failsoft.zoo.testing import build_tiny_zoo


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this run's zoos go: a directory every xdist worker of the run sees."""
    if root := os.environ.get("FAILSOFT_TEST_ZOO"):
        out = Path(root + "-shared")
    else:
        base = tmp_path_factory.getbasetemp()
        # an xdist worker's base temp is <run>/popen-gwN: the run's directory is its parent
        out = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-zoos"
    out.mkdir(parents=True, exist_ok=True)
    return out


def tiny_zoo_of(tmp_path_factory: pytest.TempPathFactory, families: Sequence[str]) -> ModelRepository:
    """A repository of ``families`` (whole tiny-zoo families, quickly profiled), built once per run."""
    shared = shared_dir(tmp_path_factory)
    names = sorted(set(families))
    if len(names) == 1:
        return ModelRepository(_family(shared, names[0]))
    target = shared / ("zoo-" + "-".join(names))
    with FileLock(str(target) + ".lock"):
        for name in names:
            if not (target / name).is_dir():
                built = _family(shared, name)
                shutil.copytree(built / name, target / name, dirs_exist_ok=True)
        return build_tiny_zoo(target, families=names)


def _family(shared: Path, name: str) -> Path:
    """The one build of family ``name`` this run (a repository holding it alone)."""
    out = shared / ("family-" + name)
    with FileLock(str(out) + ".lock"):
        build_tiny_zoo(out, families=(name,))
    return out
