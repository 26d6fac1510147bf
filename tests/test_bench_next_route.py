"""``bench failover``'s in-flight column from the gateway's move records (wall-clock seconds)."""

from __future__ import annotations

from failsoft.bench.next_route import moved_requests, summarize_moves

KILL = 100.0


def move(app: str, started: float, sent: float, answered: float, **extra: object) -> dict[str, object]:
    base = {"app": app, "left": "a1", "to": "a2", "via": "backup", "started_at": started}
    times = {"lost_at": None, "failed_at": None, "route_at": None, "route_seen_at": None}
    return base | times | {"sent_at": sent, "answered_at": answered} | extra


def test_each_request_is_measured_from_the_kill_or_its_later_arrival():
    moves = [
        # in flight at the kill: failed at the connection's end, 12 ms after, sent on at once
        move("cam-1", KILL - 0.05, KILL + 0.012, KILL + 0.020, lost_at=KILL + 0.011, failed_at=KILL + 0.012),
        # came 30 ms after the kill and skipped the dead server: 1 ms to its next route
        move("ocr-1", KILL + 0.030, KILL + 0.031, KILL + 0.035, lost_at=KILL + 0.011),
        # the controller's route: published 15 ms after the kill, seen 60 ms after
        move(
            "cam-1",
            KILL - 0.01,
            KILL + 0.061,
            KILL + 0.07,
            via="route",
            route_at=KILL + 0.015,
            route_seen_at=KILL + 0.060,
        ),
        move("cam-1", KILL - 5.0, KILL - 4.0, KILL - 3.9),  # an earlier failure's: not this kill's
        move("other", KILL, KILL + 0.01, KILL + 0.02),  # not an affected app
        move("cam-1", KILL, KILL + 0.01, KILL + 0.02, left="b1"),  # not off a killed server
    ]
    rows = moved_requests(moves, {"a1": KILL}, {"cam-1", "ocr-1"})
    assert [(r["app"], r["next_route_ms"], r["answer_ms"], r["in_flight_at_kill"]) for r in rows] == [
        ("cam-1", 12.0, 20.0, True),
        ("ocr-1", 1.0, 5.0, False),
        ("cam-1", 61.0, 70.0, True),
    ]
    assert rows[2]["timeline_ms"] == {
        "arrived": -10.0, "route_published": 15.0, "route_seen": 60.0, "sent": 61.0, "answered": 70.0,
    }  # fmt: skip
    summary = summarize_moves(rows)
    assert (summary["requests"], summary["in_flight_at_kill"], summary["via"]) == (
        3, 2, {"backup": 2, "route": 1},
    )  # fmt: skip
    assert summary["next_route_ms"] == {"p50": 12.0, "max": 61.0}
    assert summary["next_route_ms_by_via"] == {
        "backup": {"requests": 2, "p50": 6.5, "max": 12.0},
        "route": {"requests": 1, "p50": 61.0, "max": 61.0},
    }
    assert summary["next_route_ms_by_app"]["cam-1"] == {"requests": 2, "p50": 36.5, "max": 61.0}
    assert summary["answer_ms"] == {"p50": 20.0, "max": 70.0}
    assert summary["timeline_ms"]["connection_end"] == 11.0 and "measures" in summary


def test_no_moves_is_said_plainly():
    summary = summarize_moves([])
    assert summary["requests"] == 0 and summary["next_route_ms"] == {"p50": None, "max": None}
