"""``bench failover``'s reading of a crash: per killed server, when it was detected, by what, and
when it was killed after the first (the kills are one call each)."""

from __future__ import annotations

import pytest

from failsoft.bench.failover import measure


def test_each_killed_server_has_its_detection_its_cause_and_its_kill_offset() -> None:
    kill_at = {"p1": 100.0, "p3": 100.035}  # the second kill 35 ms after the first
    report = {
        "events": [
            {"type": "failure", "server": "p1", "timestamp": 100.004, "detected_at": 100.004},
            {"type": "failure", "server": "p3", "timestamp": 100.038, "detected_at": 100.038},
        ],
        "recoveries": [],
    }
    report["events"][0]["cause"] = "process"  # its sidecar's notice; p3's heartbeats went silent
    out = measure({"apps": []}, [], kill_at, [], report)
    # each from its own kill
    assert out["detection_ms"] == {"p1": pytest.approx(4.0), "p3": pytest.approx(3.0)}
    assert out["detected_by"] == {"p1": "process", "p3": "heartbeats"}
    assert out["kill_offset_ms"] == {"p1": 0.0, "p3": pytest.approx(35.0)}
