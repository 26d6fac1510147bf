"""A coded service's members checked before deployment: data members of one variant, each with a home."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from failsoft.errors import ConfigError
from failsoft.services import CodedParams, Service, ServiceMode
from failsoft.zoo.parity import check_coded_service

SERVICE = Service("digits", ServiceMode.CODED, ("d0", "d1", "p0"), CodedParams(k=2, r=1))


def app(name: str, family: str, variant: str | None) -> SimpleNamespace:
    primary = None if variant is None else SimpleNamespace(server="s1", variant=variant)
    return SimpleNamespace(name=name, family=family, primary=primary)


def test_data_members_of_two_variants_are_refused_naming_both():
    apps = {
        "d0": app("d0", "digits_mlp", "mlp_m"),
        "d1": app("d1", "digits_mlp", "mlp_s"),
        "p0": app("p0", "digits_mlp_parity", "mlp_m_add_k2_r1_p0"),
    }
    with pytest.raises(
        ConfigError, match=r"\['digits_mlp/mlp_m', 'digits_mlp/mlp_s'\]; a coding group serves one"
    ):
        check_coded_service(None, SERVICE, apps)  # type: ignore[arg-type]


def test_a_member_without_a_primary_placement_is_refused():
    apps = {"d0": app("d0", "digits_mlp", None), "d1": app("d1", "digits_mlp", "mlp_m")}
    with pytest.raises(ConfigError, match="member 'd0' has no primary placement"):
        check_coded_service(None, SERVICE, apps)  # type: ignore[arg-type]
