"""Stateful models (HAMS): a state moved to a fresh copy continues exactly, outputs depend on history,
a state that does not fit is refused, and a config refuses a stateful graph node on a stateless model.

The variants are stored and loaded through the real repository path (``config.json`` with
``stateful``, safetensors weights), with seeded untrained weights: training changes none of these
properties and would cost tens of seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failsoft.errors import ConfigError, StateMismatchError
from failsoft.runtime.config import config_from_dict
from failsoft.zoo import ModelRepository
from failsoft.zoo.build import install_variant, store_variant
from failsoft.zoo.catalog import exposes_state, family_spec
from failsoft.zoo.digits import load_digits_split
from failsoft.zoo.layout import Accuracy
from failsoft.zoo.stateful import (
    ModelState,
    StatefulModel,
    sp500_architecture,
    sp500_lags,
    sp500_series,
    stateful_io,
)

MODELS = [("sp500_gru", "gru_16"), ("sp500_gru2", "gru_16_x2"), ("digits_online", "logreg")]


def _store(repo: ModelRepository, family: str, variant: str, seed: int) -> None:
    import torch

    from failsoft.zoo.stateful import build_stateful_module

    fam = family_spec(family)
    var = fam.variant(variant)
    architecture = var.architecture()
    torch.manual_seed(seed)
    module = build_stateful_module(var.arch, architecture)
    accuracy = Accuracy(0.0, "declared")
    install_variant(
        repo, family, variant, lambda d: store_variant(d, fam, var, module, architecture, accuracy)
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    repository = ModelRepository(tmp_path_factory.mktemp("stateful-zoo"))
    for family, variant in MODELS:
        _store(repository, family, variant, seed=0)
    return repository


def _load(repo: ModelRepository, family: str, variant: str) -> StatefulModel:
    model = repo.load(family, variant, "cpu")
    assert isinstance(model, StatefulModel)
    return model


def _requests(family: str, start: int, n: int) -> np.ndarray:
    """``n`` requests of the family's real data from position ``start`` (digits: labelled)."""
    if family == "sp500_gru":
        return np.array(sp500_series()[start : start + n, None])
    if family == "sp500_gru2":  # the value and the one before it
        import torch

        lags = sp500_lags(torch.from_numpy(sp500_series().copy()), 2).numpy()
        return np.array(lags[start : start + n])
    split = load_digits_split()
    labels = split.y_train[start : start + n, None].astype(np.float32)
    return np.concatenate([split.x_train[start : start + n], labels], axis=1)


@pytest.mark.parametrize(("family", "variant"), MODELS)
def test_a_state_applied_to_a_fresh_copy_continues_exactly(
    repo: ModelRepository, family: str, variant: str
) -> None:
    primary = _load(repo, family, variant)
    history, later = _requests(family, 0, 40), _requests(family, 40, 30)
    primary.compute(history[:7])
    primary.compute(history[7:])
    shipped = primary.state().to_bytes()
    assert primary.state().seq == 40

    backup = _load(repo, family, variant)
    backup.apply_state(shipped)
    assert backup.seq == 40
    continued = primary.compute(later)
    assert np.array_equal(backup.compute(later), continued)
    assert {k: v.tolist() for k, v in backup.state().arrays.items()} == {
        k: v.tolist() for k, v in primary.state().arrays.items()
    }

    # a batch of N is N requests in order: one batch gives the same answers as the split ones
    whole = _load(repo, family, variant)
    at_once = whole.compute(np.concatenate([history, later]))
    assert np.array_equal(at_once[40:], continued)
    replay = _load(repo, family, variant)
    answers = np.concatenate(
        [replay.compute(history[:7]), replay.compute(history[7:]), replay.compute(later)]
    )
    assert np.array_equal(answers, at_once)


@pytest.mark.parametrize(("family", "variant"), MODELS)
def test_the_same_request_after_different_histories_gets_different_answers(
    repo: ModelRepository, family: str, variant: str
) -> None:
    a, b = _load(repo, family, variant), _load(repo, family, variant)
    a.compute(_requests(family, 0, 20))
    b.compute(_requests(family, 100, 20))
    probe = _requests(family, 300, 1)
    if family == "digits_online":
        probe[:, -1] = -1  # unlabelled: the answer is the logits, nothing learnt from it
    assert not np.allclose(a.compute(probe), b.compute(probe))
    a.reset()
    b.reset()
    assert np.array_equal(a.compute(probe), b.compute(probe))


def test_the_online_learner_learns_from_labels_only(repo: ModelRepository) -> None:
    model = _load(repo, "digits_online", "logreg")
    split = load_digits_split()
    test = np.concatenate([split.x_test, np.full((len(split.x_test), 1), -1, np.float32)], axis=1)
    before = model.state()
    first = model.compute(test)
    after = model.state()
    assert after.seq == before.seq + len(test)
    assert all(np.array_equal(after.arrays[k], before.arrays[k]) for k in before.arrays)

    model.compute(_requests("digits_online", 0, len(split.y_train)))
    accuracy_before = (first.argmax(axis=1) == split.y_test).mean()
    accuracy_after = (model.compute(test).argmax(axis=1) == split.y_test).mean()
    assert accuracy_after > accuracy_before + 0.3, (accuracy_before, accuracy_after)


def test_a_bad_label_is_refused_and_changes_nothing(repo: ModelRepository) -> None:
    model = _load(repo, "digits_online", "logreg")
    bad = _requests("digits_online", 0, 2)
    bad[1, -1] = 10
    with pytest.raises(ConfigError, match="label"):
        model.compute(bad)
    assert model.seq == 0


def test_a_state_that_does_not_fit_is_refused(repo: ModelRepository, tmp_path: Path) -> None:
    gru, learner = _load(repo, "sp500_gru", "gru_16"), _load(repo, "digits_online", "logreg")
    gru.compute(_requests("sp500_gru", 0, 5))
    with pytest.raises(StateMismatchError, match="another model"):
        learner.apply_state(gru.state())

    hidden = gru.state().arrays["hidden"]
    wrong_shape = ModelState(gru.model_id, 5, {"hidden": np.zeros((1, hidden.shape[1] + 1), np.float32)})
    with pytest.raises(StateMismatchError, match="'hidden'"):
        gru.apply_state(wrong_shape.to_bytes())
    with pytest.raises(StateMismatchError, match="arrays"):
        gru.apply_state(ModelState(gru.model_id, 5, {"h": hidden}))
    with pytest.raises(StateMismatchError, match="not a model state"):
        gru.apply_state(b"\x00" * 32)

    other = ModelRepository(tmp_path / "other")  # the same variant with other weights
    _store(other, "sp500_gru", "gru_16", seed=1)
    with pytest.raises(StateMismatchError, match="another model"):
        _load(other, "sp500_gru", "gru_16").apply_state(gru.state())
    assert gru.seq == 5  # nothing applied


def _graph_config(family: str, variant: str | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"name": "predict", "app": "predict", "stateful": True}
    if variant:
        node["variant"] = variant
    return {
        "servers": [{"name": "s1", "site": "a", "memory_mb": 1024}],
        "apps": [{"name": "ingest", "family": "digits_mlp"}, {"name": "predict", "family": family}],
        "services": [
            {
                "name": "stocks",
                "mode": "graph",
                "members": ["ingest", "predict"],
                "params": {
                    "nodes": [{"name": "ingest", "app": "ingest"}, node],
                    "edges": [["ingest", "predict"]],
                },
            }
        ],
    }


def test_config_refuses_a_stateful_node_on_a_stateless_variant() -> None:
    with pytest.raises(ConfigError, match=r"graph node 'predict' is stateful.*exposes no state"):
        config_from_dict(_graph_config("digits_mlp"))
    with pytest.raises(ConfigError, match="graph node 'predict'"):
        config_from_dict(_graph_config("resnet", "resnet18"))
    for family, variant in [("sp500_gru", None), ("sp500_gru", "gru_64"), ("digits_online", "mlp_head")]:
        config = config_from_dict(_graph_config(family, variant))
        assert config.services[0].params.nodes[1].stateful


def test_a_built_variant_answers_from_its_config(repo: ModelRepository) -> None:
    assert exposes_state("sp500_gru", "gru_16", repo.root)
    assert exposes_state("digits_online", None, repo.root)  # every built variant is stateful
    assert not exposes_state("no_such_family", None, repo.root)
    assert not exposes_state("digits_mlp", "mlp_s")


@pytest.mark.parametrize(("family", "variant"), MODELS)
def test_the_profiler_example_batch_is_a_batch_the_model_accepts(
    repo: ModelRepository, family: str, variant: str
) -> None:
    model = _load(repo, family, variant)
    assert model.compute(model.example_batch(4)).shape == (4, model.num_classes)
    assert model.seq == 4


def test_the_two_input_gru_reads_the_value_and_the_one_before_and_the_one_input_config_is_unchanged():
    import torch

    z = torch.arange(5, dtype=torch.float32)
    np.testing.assert_array_equal(sp500_lags(z, 2).numpy(), [[0, 0], [1, 0], [2, 1], [3, 2], [4, 3]])
    assert "inputs" not in sp500_architecture(16)  # gru_16's config (and weights' hash) as before
    assert sp500_architecture(16, 2)["inputs"] == 2
    assert stateful_io("sp500_gru", sp500_architecture(16, 2)) == ((2,), 1)
    assert stateful_io("sp500_gru") == ((1,), 1)


def test_statecost_measures_every_stateful_variant_built(
    repo: ModelRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from failsoft.zoo import statecost

    threads = torch.get_num_threads()
    try:
        assert statecost.main([str(repo.root)]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["family"], r["variant"]) for r in rows) == sorted(MODELS)
    gru = next(r for r in rows if r["variant"] == "gru_16")
    assert gru["state_arrays"] == {"hidden": [1, 16]} and gru["state_bytes"] == 64
    assert gru["wire_bytes"] > gru["state_bytes"] and gru["apply_ms"] > 0
