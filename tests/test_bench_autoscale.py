"""``failsoft bench autoscale``: which app it benches and how a step is summarised (the cluster run
itself is what tests/runtime/test_replicas_live.py checks; the README's figures come from it)."""

from __future__ import annotations

import pytest

from failsoft.bench.autoscale import _app, _step
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import Sample
from tests.runtime.test_config import base


def test_the_first_autoscaled_app_is_benched_unless_one_is_named():
    data = base()
    data["apps"][1]["autoscaling"] = {"max_replicas": 2}
    cfg = config_from_dict(data, source="c.yaml")
    assert _app(cfg, None) == "y" and _app(cfg, "y") == "y"
    with pytest.raises(ConfigError, match=r"app 'x' has no autoscaling in c\.yaml"):
        _app(cfg, "x")
    with pytest.raises(ConfigError, match=r"no app of c\.yaml has autoscaling"):
        _app(config_from_dict(base(), source="c.yaml"), None)


def test_a_step_counts_failures_and_takes_its_p99_after_the_settling_time():
    samples = [Sample("y", t, t + 0.010, True, "s1") for t in (0.0, 0.5, 1.0)]
    samples += [Sample("y", 2.0 + i * 0.01, 2.0 + i * 0.01 + 0.002, True, "s2") for i in range(100)]
    samples.append(Sample("y", 3.0, 3.1, False, None, error="503"))
    step = _step(8, 12.0, samples, 3, settle_s=2.0)
    assert (step["in_flight"], step["requests"], step["failed"], step["replicas_at_end"]) == (8, 104, 1, 3)
    assert step["p99_ms"] == pytest.approx(2.0)  # the three slow ones came before the settling time
    assert step["by_server"] == {"-": 1, "s1": 3, "s2": 100}
