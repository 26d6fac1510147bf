"""``bench failover``'s reading of a crash: per killed server, when it was detected, by what, and
when it was killed after the first (older runs: one call each; now one call kills them all)."""

from __future__ import annotations

import pytest

from failsoft.bench.failover import _kill, measure


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


class AdminCalls:
    """Records the admin calls a bench makes (the endpoint itself: tests/runtime/gateway/test_gateway.py
    and tests/runtime/test_chaos.py, on real processes), answering as the gateway does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def admin(self, action: str, **body: object) -> dict:
        self.calls.append((action, body))
        names = body.get("servers") or [body.get("server") or "x1"]
        return {"killed": [{"server": n, "at": 100.0 + i * 1e-5} for i, n in enumerate(names)]}


def test_servers_that_die_at_once_are_killed_in_one_call() -> None:
    client = AdminCalls()
    assert _kill(client, ["t1", "t4"], None) == {"t1": 100.0, "t4": pytest.approx(100.00001)}
    assert _kill(client, ["a1"], None) == {"a1": 100.0}
    assert list(_kill(client, ["x1", "x2"], "edge-x")) == ["x1"]  # a site: the gateway's list
    assert client.calls == [
        ("kill", {"servers": ["t1", "t4"]}),
        ("kill", {"server": "a1"}),
        ("kill", {"site": "edge-x"}),
    ]
