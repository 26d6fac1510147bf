"""Core times leave the core as wall-clock times that do not move between publishes.

The gateway tells one failure from the next by its detection time as published in the routing table;
if the conversion jittered (the offset re-read at every tick), the upgrade route of a progressive
failover would look like a second failure and be counted as a second recovery, with a first answer
seconds late (seen in the demo: ocr-1's first answer 3106 ms against a client outage of 158 ms).
"""

from __future__ import annotations

from failsoft.orchestration import ClusterState
from failsoft.orchestration.state import WALL_DRIFT_S
from tests.orchestration.test_core import cluster


def test_jitter_below_the_drift_bound_keeps_the_conversion_fixed() -> None:
    state = ClusterState.deployed(cluster())
    state.sync_wall(1_000.0, 10.0)
    detected = state.wall(12.5)
    for jitter in (0.0003, -0.002, 0.9 * WALL_DRIFT_S, -0.9 * WALL_DRIFT_S):
        state.sync_wall(1_000.0 + 5.0 + jitter, 15.0)
        assert state.wall(12.5) == detected  # bit for bit: the gateway compares these floats


def test_a_real_drift_is_followed() -> None:
    state = ClusterState.deployed(cluster())
    state.sync_wall(1_000.0, 10.0)
    state.sync_wall(1_000.0 + 5.0 + 2 * WALL_DRIFT_S, 15.0)  # e.g. NTP stepped the wall clock
    assert state.wall(15.0) == 1_000.0 + 5.0 + 2 * WALL_DRIFT_S


def test_a_failover_route_keeps_its_detection_time_across_publishes() -> None:
    state = ClusterState.deployed(cluster())
    rec = state.apps["A"]
    rec.detected_at = 11.0
    state.sync_wall(1_000.0, 10.0)
    first = state.route_entry("A")["route"]["detected_at"]
    state.sync_wall(1_003.0 + 0.004, 13.0)  # three seconds later (an upgrade), a few ms of jitter
    assert state.route_entry("A")["route"]["detected_at"] == first
