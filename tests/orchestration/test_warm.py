"""Warm-backup re-planning when the proactive policy fails (the core on its own, explicit times)."""

from __future__ import annotations

import logging

from failsoft.orchestration import PlanProactive
from tests.orchestration.test_core import Harness, cluster


def test_a_failed_proactive_plan_is_logged_and_planned_again_once_quiet(caplog):
    h = Harness(cluster(), replan_warm=True, replan_delay_s=0.5)
    h.core.warm.dirty = True
    (first,) = h.of(PlanProactive, h.take(h.core.advance(1.0)))
    with caplog.at_level(logging.WARNING, logger="failsoft.orchestration.warm"):
        h.take(h.core.proactive_planned(first.plan_id, None, 1.1, error="solver crashed"))
    assert "solver crashed" in caplog.text
    assert h.core.warm.task is None and h.core.warm.dirty
    assert not h.of(PlanProactive, h.take(h.core.advance(1.5)))  # quiet for 0.4 s only
    (again,) = h.of(PlanProactive, h.take(h.core.advance(1.7)))
    assert again.plan_id != first.plan_id
