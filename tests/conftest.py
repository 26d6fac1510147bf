"""Shared fixtures, and the guard that keeps the ``runtime`` marker honest.

``pytest -m "not runtime"`` must leave out every test that starts Ray, so a test that starts Ray
without the marker fails. Every failsoft cluster, in the test process, is started by ``ray.init``
(through ``failsoft.runtime.cluster``, the one module that imports Ray), so ``ray.init`` is wrapped
once for the session: it fails, naming the test, when the test being run (its setup, call or
teardown: a module-scoped cluster fixture counts for the test that first asks for it) has no
``runtime`` marker. Ray is imported for that at the start of the session (about a second).
Clusters started in a *subprocess* (``failsoft serve`` run as a command) are out of its sight:
those tests carry the marker by hand (``tests/runtime/test_cli.py``).

One embedded Ray instance serves every cluster of an xdist worker that asks for the same settings
(:func:`failsoft.runtime.cluster.keep_embedded`): Ray's start is 3-5 s and about 5 s of a core,
paid once per worker instead of once per cluster. ``RayCluster.start`` is guarded too, since a
cluster on the kept instance calls no ``ray.init``. A test that needs a Ray of its own (one whose
start it watches) turns keeping off for itself (``tests/runtime/test_raystart.py``).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from failsoft.zoo import ModelRepository

_running: list[pytest.Item] = []  # the test whose setup, call or teardown runs now


@pytest.fixture(autouse=True)
def _failsoft_logger_restored() -> Iterator[None]:
    """Each test leaves the ``failsoft`` logger as it found it. ``failsoft serve`` run in-process (as
    the CLI tests do) configures it as the command configures its process, with a stderr handler
    that would outlive the test: a record that a later test's leftover thread logs would then land
    in whatever stderr that test captures (a one-line error test once read a replica's log line)."""
    target = logging.getLogger("failsoft")
    handlers, level = list(target.handlers), target.level
    yield
    for handler in [h for h in target.handlers if h not in handlers]:
        target.removeHandler(handler)
    target.setLevel(level)


def ray_refusal(item: pytest.Item | None) -> str | None:
    """Why ``item`` may not start Ray, or None when it may."""
    if item is None or item.get_closest_marker("runtime") is not None:
        return None
    return (
        f"{item.nodeid} starts Ray without the 'runtime' marker: mark it (or its module: "
        "pytestmark = [pytest.mark.runtime, pytest.mark.slow]) so that -m 'not runtime' leaves it out"
    )


def _guard(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        refusal = ray_refusal(_running[-1] if _running else None)
        if refusal:
            raise AssertionError(refusal)
        return init(*args, **kwargs)

    guarded.__failsoft_guard__ = True  # type: ignore[attr-defined]
    return guarded


# what pytest sets per test (PYTEST_CURRENT_TEST): no process of a cluster reads it
RUNNER_ENV = ("PYTEST_",)


def _compile_failsoft() -> None:
    """Write failsoft's bytecode once for the run. An editable install has none, and where
    ``PYTHONDONTWRITEBYTECODE`` is set no process writes it: each of the run's several hundred
    processes (agents, controllers, LLM workers, load generators, CLI commands) would compile the
    modules it imports again, 0.25-0.45 s of a core each for an agent's. Python reads bytecode
    whatever that variable says; ``compileall`` writes it where the sources are (``__pycache__``,
    ignored by git), checked against their modification times as usual."""
    import compileall
    from pathlib import Path

    import failsoft

    compileall.compile_dir(Path(failsoft.__file__).parent, quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's first process (xdist's controller, or alone)
        _compile_failsoft()
    import ray

    from failsoft.runtime import cluster

    if not getattr(ray.init, "__failsoft_guard__", False):
        ray.init = _guard(ray.init)
    if not getattr(cluster.RayCluster.start, "__failsoft_guard__", False):
        cluster.RayCluster.start = _guard(cluster.RayCluster.start)  # type: ignore[method-assign]
    cluster.keep_embedded(True, ignore_env=RUNNER_ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    from failsoft.runtime import cluster

    cluster.keep_embedded(False)  # stops the kept instance


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """The real digits_mlp family (4 variants), built and quickly profiled once per run for every
    test directory and xdist worker (about 20 s; :mod:`tests.zoos`); tests must not modify it (copy
    it instead). ``$FAILSOFT_TEST_ZOO`` may name a directory that keeps it between runs."""
    from tests.zoos import tiny_zoo_of

    return tiny_zoo_of(tmp_path_factory, ("digits_mlp",))
