"""``replicas`` and ``autoscaling`` in a serving config: parsed into the deployed apps, or refused
with one line naming the app and what is wrong."""

from __future__ import annotations

import pytest

from failsoft.domain import Autoscaling
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.deployment import resolve
from tests.runtime.test_config import FAM, base


def with_app(**fields: object) -> dict:
    data = base()
    data["apps"] = [{"name": "x", "family": "fam", **fields}, data["apps"][1]]
    return data


def test_replicas_and_autoscaling_reach_the_deployed_apps():
    cfg = config_from_dict(with_app(replicas=2))
    x, y = resolve(cfg, [FAM]).apps
    assert (x.replicas, x.autoscaling, x.min_replicas, y.replicas) == (2, None, 2, 1)
    cfg = config_from_dict(
        with_app(autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 3})
    )
    (x, _) = resolve(cfg, [FAM]).apps
    assert x.autoscaling == Autoscaling(1, 2, 3.0) and x.min_replicas == 1


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"replicas": 0}, r"apps\[0\] \('x'\)\.replicas: Input should be greater than or equal to 1"),
        ({"replicas": 3}, r"apps\[0\] \('x'\): replicas is 3, but there are 2 servers"),
        ({"replicas": 2, "autoscaling": {}}, r"'x'\): give replicas .* or autoscaling, not both"),
        ({"autoscaling": {"max_replicas": 5}}, r"autoscaling\.max_replicas is 5, but there are 2 servers"),
        (
            {"autoscaling": {"min_replicas": 2, "max_replicas": 1}},
            r"min_replicas \(2\) is above max_replicas",
        ),
        ({"autoscaling": {"target_ongoing_requests": 0}}, r"target_ongoing_requests"),
        ({"autoscaling": {"max": 2}}, r"\('x'\)\.autoscaling: unknown field 'max'"),
    ],
)
def test_a_bad_scaling_setting_is_one_line_naming_the_app(fields, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        config_from_dict(with_app(**fields), source="c.yaml")
    assert "\n" not in str(info.value)


def test_a_service_member_cannot_scale():
    data = with_app(replicas=2)
    data["apps"].append({"name": "z", "family": "fam"})
    data["services"] = [
        {"name": "g", "mode": "coded", "members": ["x", "y", "z"], "params": {"k": 2, "r": 1}}
    ]
    with pytest.raises(ConfigError, match="'x' has replicas or autoscaling but is a member of service 'g'"):
        config_from_dict(data)
