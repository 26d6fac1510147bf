"""The serving benchmark's pieces without a cluster: the in-process limit (a model whose weights
outgrow the caches, a numpy matrix of 8 MB, timed hot and cold after a sweep), the ratios to the Ray
Serve anchors, an anchor skipped for a missing optional dependency, and the check of an anchor's
answers against the in-process logits."""

from __future__ import annotations

import numpy as np
import pytest

from failsoft.bench.serving import inprocess, ratios
from failsoft.bench.serving_anchor_process import AnchorSpec, check_answers, missing
from failsoft.errors import FailsoftError


class Matrix:
    """A memory-bound "model": one matrix-vector product over 8 MB of float32 weights."""

    input_shape = (2048,)

    def __init__(self) -> None:
        self.weights = np.random.default_rng(0).random((1024, 2048), dtype=np.float32)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return batch @ self.weights.T


def test_the_limit_is_timed_hot_and_after_the_caches_were_swept() -> None:
    out = inprocess(Matrix(), 0.1)
    assert out["requests"] > 0 and out["p50_ms"] > 0
    assert out["cold_p50_ms"] > 0


def _level(rps: float) -> dict[str, float]:
    return {"rps": rps}


def test_failsoft_is_set_against_each_ray_serve_anchor_per_encoding_and_level() -> None:
    systems = {
        "failsoft": {"json": {"closed_8": _level(400.0)}, "binary": {"closed_8": _level(300.0)}},
        "ray-serve": {"json": {"closed_8": _level(50.0)}, "binary": {"closed_8": _level(60.0)}},
        "ray-serve-batch": {"status": "measured", "json": {"closed_8": _level(80.0)}},
    }
    out = ratios(systems)
    assert out["failsoft_to_ray_serve"] == {"json_closed_8": 8.0, "binary_closed_8": 5.0}
    assert out["failsoft_to_ray_serve_batch"] == {"json_closed_8": 5.0}  # binary was not measured


def test_a_skipped_anchor_has_no_ratio() -> None:
    reason = "skipped: ray.serve is not importable"
    systems = {"failsoft": {"json": {"closed_1": _level(100.0)}}, "ray-serve": {"status": reason}}
    assert "failsoft_to_ray_serve" not in ratios(systems)


def test_an_anchor_whose_optional_dependency_is_missing_is_skipped_with_the_reason() -> None:
    reason = missing(AnchorSpec("failsoft.bench.serving_anchor", needs="failsoft_no_such_module"))
    assert reason is not None and "failsoft_no_such_module is not importable" in reason
    assert "pip install 'failsoft[anchors]'" in reason
    assert missing(AnchorSpec("failsoft.bench.serving_anchor")) is None


def test_an_anchor_that_answers_other_logits_is_not_measured() -> None:
    expected = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)

    def answer(values: np.ndarray) -> dict:
        return {"outputs": [{"shape": list(values.shape), "data": values.ravel().tolist()}]}

    check = check_answers("x", {"json": answer(expected), "binary": answer(expected + 1e-7)}, expected)
    assert check["json"]["max_abs_diff"] == 0.0 and check["binary"]["max_abs_diff"] < 1e-6
    with pytest.raises(FailsoftError, match=r"the x anchor answered binary with logits .* differ"):
        check_answers("x", {"binary": answer(expected + 0.01)}, expected)
    with pytest.raises(FailsoftError, match=r"shape \(3,\)"):
        check_answers("x", {"json": answer(expected.ravel())}, expected)
