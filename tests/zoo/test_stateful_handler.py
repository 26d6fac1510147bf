"""A user's stateful ``python`` handler: the contract's ``state()``/``apply_state()``/``reset()``, its
wrapper (the same :class:`Stateful` interface as the zoo's own stateful models), ``zoo add``'s
round-trip check and what it records, and the config check of a HAMS graph node on it.

The handler is :class:`~failsoft.zoo.formats.examples.OnlineKMeans` (sequential k-means, its
centroids and counts the state), added with ``zoo add`` into a temporary repository; the broken
handlers below are what ``zoo add`` must refuse, each named by its import path as a user would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failsoft.errors import ConfigError, CorruptModelError, StateMismatchError
from failsoft.runtime.config import config_from_dict
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.catalog import exposes_state
from failsoft.zoo.formats import examples
from failsoft.zoo.formats.examples import MlpHandler, OnlineKMeans
from failsoft.zoo.formats.interface import Handler, is_stateful
from failsoft.zoo.formats.stateful_handler import StatefulHandlerModel
from failsoft.zoo.profiler import ProfileSettings
from failsoft.zoo.state import ModelState, Stateful

FAST = ProfileSettings(
    loads=1, warm_loads=0, batch_sizes=(1,), warmup_iters=0, min_iters=1, max_iters=1, budget_s=0.0
)
KMEANS = "failsoft.zoo.formats.examples:OnlineKMeans"
MLP = "failsoft.zoo.formats.examples:MlpHandler"
HERE = "tests.zoo.test_stateful_handler"
FEATURES, CLUSTERS = examples.KMEANS_SIZES


def points(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (n, FEATURES)).astype(np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """``clusters/kmeans`` (OnlineKMeans) and ``clusters/kmeans2`` (other weights), added with zoo add."""
    out = tmp_path_factory.mktemp("stateful-handler")
    np.save(out / "sample.npy", points(3, seed=0))
    repository = ModelRepository(out / "zoo")
    for variant, seed in (("kmeans", 0), ("kmeans2", 1)):
        weights = examples.kmeans_artefact(out / f"{variant}.safetensors", seed)
        request = AddRequest(
            "clusters", variant, weights, accuracy=0.5, sample_file=out / "sample.npy", handler=KMEANS
        )
        add_variant(repository, request, FAST)
    return repository


def load(repo: ModelRepository, variant: str = "kmeans") -> StatefulHandlerModel:
    model = repo.load("clusters", variant, "cpu")
    assert isinstance(model, StatefulHandlerModel)
    return model


def add(tmp_path: Path, handler: str) -> ModelRepository:
    repo = ModelRepository(tmp_path / "zoo")
    weights = examples.kmeans_artefact(tmp_path / "w.safetensors")
    add_variant(repo, AddRequest("clusters", "bad", weights, accuracy=0.5, handler=handler), FAST)
    return repo


# the contract -----------------------------------------------------------------------------------
class OnlyState(OnlineKMeans):
    """Defines state() but inherits apply_state() from Handler: not a whole stateful handler."""

    apply_state = Handler.apply_state  # type: ignore[assignment]  # the base's: no state


class Forgetful(OnlineKMeans):
    """Its apply_state() ignores the state: a backup would answer as if it had seen nothing."""

    def apply_state(self, state: Mapping[str, np.ndarray]) -> None:
        if not hasattr(self, "_centroids"):
            super().apply_state(state)


class ObjectState(OnlineKMeans):
    """Its state holds Python objects, which safetensors cannot carry (and pickle must not)."""

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "names": np.array(["a", "b"], dtype=object)}


def test_a_handler_that_defines_state_and_apply_state_is_stateful() -> None:
    assert is_stateful(OnlineKMeans) and not is_stateful(MlpHandler)
    with pytest.raises(ConfigError, match=r"defines state\(\) but not apply_state\(\)"):
        is_stateful(OnlyState)


def test_zoo_add_records_a_stateful_handler_and_exposes_its_state(repo: ModelRepository) -> None:
    config = json.loads((repo.root / "clusters" / "kmeans" / "config.json").read_text())
    assert config["stateful"] is True and config["handler"] == {"class": KMEANS}
    assert config["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [FEATURES]}]
    assert exposes_state("clusters", "kmeans", repo.root) and exposes_state("clusters", None, repo.root)
    model = load(repo)
    assert isinstance(model, Stateful) and model.seq == 0  # the interface the agents and HAMS use
    assert model.model_id.startswith("clusters/kmeans@")


def test_a_state_shipped_as_bytes_continues_exactly_and_batching_changes_nothing(
    repo: ModelRepository,
) -> None:
    history, later = points(40), points(25, seed=2)
    primary = load(repo)
    primary.compute(history[:7])
    primary.compute(history[7:])
    shipped = primary.state().to_bytes()
    assert ModelState.from_bytes(shipped).seq == 40

    backup = load(repo)
    backup.apply_state(shipped)
    assert backup.seq == 40
    continued = primary.compute(later)
    np.testing.assert_array_equal(backup.compute(later), continued)
    for name, arr in primary.state().arrays.items():
        np.testing.assert_array_equal(backup.state().arrays[name], arr)

    at_once = load(repo).compute(np.concatenate([history, later]))  # one batch of 65 requests
    np.testing.assert_array_equal(at_once[40:], continued)
    assert not np.array_equal(load(repo).compute(later), continued)  # the history matters


def test_reset_is_the_initial_state_and_a_state_is_a_copy(repo: ModelRepository) -> None:
    model = load(repo)
    first = model.compute(points(5))
    taken = model.state()
    before = {k: v.copy() for k, v in taken.arrays.items()}
    model.compute(points(5, seed=3))
    for name, arr in before.items():  # the model went on; the state taken earlier did not
        np.testing.assert_array_equal(taken.arrays[name], arr)
    model.reset()
    assert model.seq == 0
    np.testing.assert_array_equal(model.compute(points(5)), first)


def test_a_state_that_does_not_fit_is_refused_naming_what_differs(repo: ModelRepository) -> None:
    model, other = load(repo), load(repo, "kmeans2")
    model.compute(points(3))
    state = model.state()
    with pytest.raises(StateMismatchError, match="another model"):
        other.apply_state(state.to_bytes())  # the same handler, other weights
    wrong = dict(state.arrays) | {"counts": np.zeros(CLUSTERS + 1, np.int64)}
    with pytest.raises(StateMismatchError, match=r"array 'counts' is int64\[9\], expected int64\[8\]"):
        model.apply_state(ModelState(model.model_id, 3, wrong))
    recast = dict(state.arrays) | {"counts": state.arrays["counts"].astype(np.float32)}
    with pytest.raises(StateMismatchError, match="'counts' is float32"):
        model.apply_state(ModelState(model.model_id, 3, recast))
    with pytest.raises(StateMismatchError, match=r"arrays \['centroids'\], expected"):
        model.apply_state(ModelState(model.model_id, 3, {"centroids": state.arrays["centroids"]}))
    with pytest.raises(StateMismatchError, match="not a model state"):
        model.apply_state(b"\x00" * 32)
    assert model.seq == 3  # nothing applied


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (f"{HERE}:Forgetful", r"apply_state\(state\(\)\) must restore the answers"),
        (f"{HERE}:ObjectState", r"array 'names' is object: a state holds named arrays of numbers"),
        (f"{HERE}:OnlyState", r"defines state\(\) but not apply_state\(\)"),
    ],
)
def test_zoo_add_refuses_a_handler_whose_state_does_not_round_trip(
    tmp_path: Path, handler: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        add(tmp_path, handler)
    assert not (tmp_path / "zoo").exists()  # nothing left behind


def test_a_config_saying_stateful_needs_a_stateful_handler(repo: ModelRepository, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(repo.root, tmp_path / "zoo")
    path = tmp_path / "zoo" / "clusters" / "kmeans" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(config | {"handler": {"class": MLP}}))
    with pytest.raises(CorruptModelError, match=r"says stateful, but its handler .*MlpHandler"):
        ModelRepository(tmp_path / "zoo").load("clusters", "kmeans", "cpu")


def _graph(repository: Path, family: str) -> dict[str, Any]:
    return {
        "repository": str(repository),
        "servers": [{"name": "s1", "site": "a", "memory_mb": 1024}],
        "apps": [{"name": "cluster", "family": family}],
        "services": [
            {
                "name": "online",
                "mode": "graph",
                "members": ["cluster"],
                "params": {"nodes": [{"name": "cluster", "app": "cluster", "stateful": True}], "edges": []},
            }
        ],
    }


def test_a_graph_config_takes_the_stateful_handler_as_a_stateful_node(
    repo: ModelRepository, tmp_path: Path
) -> None:
    config = config_from_dict(_graph(repo.root, "clusters"))
    assert config.services[0].params.nodes[0].stateful
    from safetensors.numpy import save_file

    mlp = ModelRepository(tmp_path / "zoo")
    save_file(examples.mlp_weights(), str(tmp_path / "mlp.safetensors"))
    add_variant(
        mlp, AddRequest("mlp", "python", tmp_path / "mlp.safetensors", accuracy=0.9, handler=MLP), FAST
    )
    with pytest.raises(ConfigError, match=r"graph node 'cluster' is stateful.*exposes no state"):
        config_from_dict(_graph(mlp.root, "mlp"))


def test_statecost_measures_a_stateful_handler(repo: ModelRepository) -> None:
    from failsoft.zoo.statecost import transfer_cost

    cost = transfer_cost(load(repo), repeats=3)
    assert cost["state_arrays"] == {"centroids": [CLUSTERS, FEATURES], "counts": [CLUSTERS]}
    assert cost["state_bytes"] == CLUSTERS * FEATURES * 4 + CLUSTERS * 8
    assert cost["wire_bytes"] > cost["state_bytes"] and cost["apply_ms"] > 0
