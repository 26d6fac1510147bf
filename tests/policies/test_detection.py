"""Heartbeat failure detection (FailLite 4): two missed 20 ms heartbeats mark a server failed."""

import pytest

from failsoft.domain import ServerState
from failsoft.policies.detection import HeartbeatDetector, RouteHealth, is_timeout


def test_two_missed_heartbeats_fail_a_server():
    d = HeartbeatDetector(interval_s=0.020, missed_to_fail=2)
    d.register("s1", now=0.0)
    d.register("s2", now=0.0)
    t = 0.0
    while t < 0.1:  # s1 keeps beating, s2 stops at t = 0.02
        t = round(t + 0.005, 3)
        if t % 0.02 < 1e-9 or abs(t % 0.02 - 0.02) < 1e-9:
            d.heartbeat("s1", t)
            if t <= 0.02:
                d.heartbeat("s2", t)
        changes = d.check(t)
        if any(c.new is ServerState.FAILED for c in changes):
            break
    assert d.state("s1") is ServerState.UP
    assert d.state("s2") is ServerState.FAILED
    assert t == pytest.approx(0.065)  # last beat 0.02 + 2 x 20 ms, seen by the next 5 ms check


def test_suspect_then_recovered_by_a_late_heartbeat():
    d = HeartbeatDetector(0.02, 2)
    d.register("s", 0.0)
    (change,) = d.check(0.025)
    assert change.new is ServerState.SUSPECT
    change = d.heartbeat("s", 0.03)
    assert change.new is ServerState.UP


def test_failed_server_that_speaks_again_is_recovering_until_marked_up():
    d = HeartbeatDetector(0.02, 2)
    d.register("s", 0.0)
    d.check(0.05)
    assert d.state("s") is ServerState.FAILED
    assert d.heartbeat("s", 1.0).new is ServerState.RECOVERING
    assert d.check(1.01) == []
    assert d.mark_up("s", 1.02).new is ServerState.UP


def test_after_a_pause_of_the_observer_verdicts_wait_one_interval():
    """A paused machine resumes: s1's sidecar speaks first, s2's a few ms later; s2 is not failed."""
    d = HeartbeatDetector(0.02, 2, pause_grace=True)
    for s in ("s1", "s2"):
        d.register(s, 0.0)
    assert d.check(0.005) == []
    d.heartbeat("s1", 0.300)  # everything was paused from 0.005 to 0.300
    assert d.check(0.301) == []  # s2 silent for 301 ms, but the observer was paused too
    d.heartbeat("s2", 0.304)
    d.heartbeat("s1", 0.320)
    assert d.check(0.306) == [] and d.check(0.322) == []
    assert d.state("s1") is d.state("s2") is ServerState.UP


def test_a_real_failure_during_a_pause_is_still_detected_one_interval_later():
    d = HeartbeatDetector(0.02, 2, pause_grace=True)
    for s in ("s1", "s2"):
        d.register(s, 0.0)
    d.check(0.005)
    d.heartbeat("s1", 0.300)  # s2 died during the pause and never speaks again
    assert d.check(0.301) == []
    assert [c.server for c in d.check(0.322) if c.new is ServerState.FAILED] == ["s2"]


def test_without_pause_grace_a_late_check_judges_at_once():
    d = HeartbeatDetector(0.02, 2)
    d.register("s", 0.0)
    assert [c.new for c in d.check(0.3)] == [ServerState.FAILED]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="interval"):
        HeartbeatDetector(0)
    with pytest.raises(ValueError, match="missed_to_fail"):
        HeartbeatDetector(0.02, 0)
    with pytest.raises(KeyError, match="unregistered"):
        HeartbeatDetector().heartbeat("ghost", 0.0)


def test_route_health_gives_one_verdict_per_run_of_errors_and_a_success_clears_it():
    health = RouteHealth(errors_to_fail=3)
    assert [health.record("s1", False) for _ in range(2)] == [False, False]
    assert not health.record("s1", True)  # one answer: it serves
    assert health.errors("s1") == 0
    assert [health.record("s1", False) for _ in range(3)] == [False, False, True]
    assert health.errors("s1") == 0  # counted again from zero after the verdict
    assert not health.record("s2", False)  # per server
    with pytest.raises(ValueError, match="errors_to_fail"):
        RouteHealth(0)


def test_timeouts_are_overload_and_never_make_a_server_unhealthy():
    health = RouteHealth(errors_to_fail=3)
    late = ["no answer within the deadline", "DeadlineExceededError: m: no answer before the deadline"]
    assert not any(health.record("s1", False, late[i % 2]) for i in range(100))  # a long overload
    assert health.timeouts("s1") == 100 and health.errors("s1") == 0
    # errors still count (chaos break: every inference raises), timeouts between them neither
    # count nor clear them
    broken = "ServingError: server 's1' failed to compute (injected fault: failsoft chaos break)"
    assert [health.record("s1", False, e) for e in (broken, late[0], broken, late[1], broken)] == [
        False, False, False, False, True,
    ]  # fmt: skip
    assert is_timeout(late[1]) and not is_timeout(broken) and not is_timeout("")


def test_a_quarantined_server_ignores_its_heartbeats_until_the_quarantine_ends():
    d = HeartbeatDetector(0.02, 2)
    d.register("s1", 0.0)
    change = d.quarantine("s1", 0.1, until=5.0)
    assert change is not None and change.new is ServerState.FAILED
    assert d.heartbeat("s1", 1.0) is None and d.state("s1") is ServerState.FAILED
    assert d.check(1.01) == []
    assert d.quarantine("s1", 1.1, until=6.0) is None  # already failed
    change = d.heartbeat("s1", 6.5)
    assert change is not None and change.new is ServerState.RECOVERING
    d.quarantine("s1", 7.0, until=100.0)
    d.release("s1")  # it restarted
    assert d.heartbeat("s1", 7.1).new is ServerState.RECOVERING


def test_a_connection_that_ends_fails_its_server_at_once():
    """The second signal: a dead process's connection ends; no missed heartbeat is waited for."""
    d = HeartbeatDetector(0.02, 2, link_grace_s=0.25)
    d.register("s", 0.0)
    assert d.link("s", True, 0.001) is None and d.linked("s")
    change = d.link("s", False, 0.005)
    assert change is not None and change.new is ServerState.FAILED and change.at == 0.005
    assert not d.linked("s") and d.link("s", False, 0.006) is None  # already failed: nothing new
    with pytest.raises(KeyError, match="nosuch"):
        d.link("nosuch", True, 0.0)


def test_a_late_heartbeat_over_a_live_connection_is_suspect_not_failed():
    """Heartbeats late behind a busy host while the connection lives: suspect up to the grace past
    the threshold, up again when they arrive; without a known connection, failed at the threshold."""
    linked, alone = (
        HeartbeatDetector(0.02, 2, link_grace_s=0.25),
        HeartbeatDetector(0.02, 2, link_grace_s=0.25),
    )
    for d in (linked, alone):
        d.register("s", 0.0)
    linked.link("s", True, 0.0)
    assert [c.new for c in linked.check(0.1)] == [ServerState.SUSPECT]
    assert [c.new for c in alone.check(0.1)] == [ServerState.FAILED]
    assert linked.next_deadline(0.1) == pytest.approx(0.29)
    assert linked.check(0.28) == []
    assert linked.heartbeat("s", 0.28).new is ServerState.UP  # it was late, not dead
    assert [c.new for c in linked.check(0.6)] == [ServerState.FAILED]  # silent past the grace: failed
    linked.forget("s")
    assert not linked.linked("s")
