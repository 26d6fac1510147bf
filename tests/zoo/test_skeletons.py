"""Module skeletons built ahead of a load (failsoft.zoo.skeletons), on the real tiny zoo."""

from __future__ import annotations

import dataclasses

import numpy as np

from failsoft.domain import Variant
from failsoft.zoo.skeletons import Skeletons, skeleton_targets


def test_a_prepared_skeleton_is_handed_out_once_and_a_load_with_it_answers_as_one_without(tiny_zoo):
    config = tiny_zoo.config("digits_mlp", "mlp_s")
    skeletons = Skeletons()
    assert skeletons.take(config) is None  # none prepared: the load builds its own
    assert skeletons.build(config) is True
    assert skeletons.build(config) is False  # one per variant
    skeleton = skeletons.take(config)
    assert skeleton is not None
    assert skeletons.take(config) is None  # consumed: the next load finds none until rebuilt
    assert skeletons.stats() == {"ready": [], "built": 1, "taken": 1, "stale": 0}

    batch = np.random.default_rng(3).random((5, 64), dtype=np.float32)
    with tiny_zoo.load("digits_mlp", "mlp_s", "cpu", skeleton) as prepared:
        # the skeleton became the model: its parameters are the file's, no longer on meta
        assert prepared._module is skeleton.module
        assert all(p.device.type == "cpu" for p in skeleton.module.parameters())
        with tiny_zoo.load("digits_mlp", "mlp_s", "cpu") as built:
            np.testing.assert_array_equal(prepared.predict(batch), built.predict(batch))


def test_a_skeleton_of_another_config_is_dropped_not_used(tiny_zoo):
    config = tiny_zoo.config("digits_mlp", "mlp_s")
    skeletons = Skeletons()
    skeletons.build(config)
    changed = dataclasses.replace(config, weights_sha256="0" * 64)  # the variant was re-added
    assert skeletons.take(changed) is None
    assert skeletons.stats()["stale"] == 1 and skeletons.ready() == []
    # and a load given a skeleton of another variant builds its own (the weights must fit)
    other = Skeletons()
    other.build(tiny_zoo.config("digits_mlp", "mlp_l"))
    wrong = other.take(tiny_zoo.config("digits_mlp", "mlp_l"))
    with tiny_zoo.load("digits_mlp", "mlp_s", "cpu", wrong) as model:
        assert model._module is not wrong.module


def test_the_targets_are_each_served_familys_smallest_variant():
    def v(name: str, mb: float) -> Variant:
        return Variant(name, mb, 0.9, 100.0, 10.0)

    profiles = [("f", v("big", 50)), ("f", v("small", 5)), ("f", v("tie", 5)), ("g", v("g1", 1))]
    profiles.append(("h", v("h1", 1)))  # a family this agent does not serve
    assert skeleton_targets(profiles, ["f", "g"]) == {("f", "small"), ("g", "g1")}
    assert skeleton_targets(profiles, []) == frozenset()
