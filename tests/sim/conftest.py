"""Fixtures of the simulator tests: the hand-checkable tiny cluster of ``sim_tiny``."""

from __future__ import annotations

import pytest
from sim_tiny import FAILURE_AT, tiny_scenario

from failsoft.domain import Scenario
from failsoft.sim import SimConfig


@pytest.fixture
def tiny() -> Scenario:
    return tiny_scenario()


@pytest.fixture
def fixed() -> SimConfig:
    return SimConfig(
        failure_at_s=FAILURE_AT, check_interval_s=0.1, request_warmup_s=0.3, random_phases=False, trace=True
    )
