"""The demo's event lines and summary never call a failure nobody caused "after the kill"."""

from __future__ import annotations

from failsoft.cli.demo import describe_event
from failsoft.runtime.demo import unexpected_failures

START, KILL = 1000.0, 1010.0


def failure(server: str, at: float) -> dict:
    return {"type": "failure", "app": "cam-5", "server": server, "timestamp": at, "detected_at": at}


def test_a_failure_before_the_kill_or_of_another_server_is_unexpected_not_after_the_kill():
    before = describe_event(failure("c1", START + 3.4), {"start": START}, killed="a1")
    assert before is not None and "nobody killed it" in before and "after the kill" not in before
    other = describe_event(failure("c1", KILL + 0.5), {"start": START, "kill": KILL}, killed="a1")
    assert other is not None and "nobody killed it" in other
    real = describe_event(failure("a1", KILL + 0.035), {"start": START, "kill": KILL}, killed="a1")
    assert real is not None and "detected 35 ms after the kill" in real


def test_the_summary_lists_servers_declared_down_that_nobody_killed():
    events = [failure("c1", START + 3.4), failure("c1", START + 3.4), failure("a1", KILL + 0.035)]
    events.append({"type": "server_up", "server": "c1", "timestamp": START + 3.45})
    found = unexpected_failures(events, {"start": START, "kill": KILL}, "a1")
    assert found == [{"server": "c1", "detected_after_start_s": 3.4}]


def test_a_failure_the_connection_gave_says_so():
    line = describe_event(
        failure("a1", KILL + 0.004) | {"cause": "connection"}, {"start": START, "kill": KILL}, killed="a1"
    )
    assert line is not None and "detected 4 ms after the kill, its connection ended" in line
