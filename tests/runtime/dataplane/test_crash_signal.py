"""The data plane's crash signal, live: an agent is SIGKILLed with requests in flight on its
connection; they are answered from the app's next route, and the failure came from proof of death
(the sidecar's death notice, ``cause: process``, or the connection's end, ``cause: connection``),
not from missed heartbeats; the gateway saw the connection end (its ``connection_lost`` event: the
sidecar's word through its watch, or the socket's close), and the controller's table that failed
s1 over reached the gateway by push.
The run's failure record (``$FAILSOFT_EVENTS_LOG``, which ``tools/soak.py`` counts) holds the kill
and the failure it caused, and no other failure.

A real embedded cluster (Ray, controller, two agents serving the real digits MLP, the gateway); s1
is slowed (5 s a batch) so that requests are queued there when it dies.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failsoft.runtime import eventlog
from tests.runtime.conftest import serving, wait_for
from tests.runtime.dataplane.conftest import critical_app_on_s1

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """The run's failure record: the soak's when it runs this (it set the variable), else one of
    ours; set before Ray starts, whose processes inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get(eventlog.EVENTS_LOG_ENV):
            mp.setenv(eventlog.EVENTS_LOG_ENV, str(tmp_path_factory.mktemp("record") / "events.jsonl"))
        yield Path(os.environ[eventlog.EVENTS_LOG_ENV])


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory, record):
    config = critical_app_on_s1(tiny_zoo, tmp_path_factory.mktemp("state"), "crash-signal-test")
    with serving(config) as running:
        yield running


def test_a_killed_agent_s_requests_in_flight_are_answered_from_the_next_route(cluster, record):
    _, client = cluster

    def ready() -> dict[str, Any] | None:
        (app,) = client.status()["apps"]
        warm = [w for w in app["warm_backups"] if w["state"] == "warm"]
        return app if app["route"]["server"] == "s1" and warm else None

    wait_for(ready, 90.0, "crit on s1 with a warm backup")
    pushed = client.status()["gateway"]["routes_taken"]["push"]
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    assert client.infer("crit", x).server == "s1"
    client.admin("slow", server="s1", ms=5000)  # one batch: every request waits 5 s
    with ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(client.infer, "crit", x, 20.0) for _ in range(6)]
        time.sleep(0.6)  # sent, and waiting in s1's queue
        assert not any(c.done() for c in calls)
        killed_at = client.admin("kill", server="s1")["killed"][0]["at"]
        answers = [c.result(timeout=30.0) for c in calls]
        answered_at = time.time()
    assert all(a.server == "s2" for a in answers), [(a.server, a.attempts) for a in answers]
    failure = _event(client, "failure", killed_at)
    assert failure.get("cause") in ("process", "connection"), failure  # not two missed heartbeats
    # the sidecar's word, or the connection's own end when the teardown was quicker than its look
    ended = _event(client, "connection_lost", killed_at)
    assert any(why in ended["reason"] for why in ("sidecar saw it", "the agent closed it")), ended
    detected_ms = (failure["detected_at"] - killed_at) * 1000.0
    answered_ms = (answered_at - killed_at) * 1000.0
    print(f"kill -> detected {detected_ms:.1f} ms; kill -> all 6 answered {answered_ms:.0f} ms")
    assert detected_ms < 1000.0
    # the failover's table came to the gateway by the controller's push, not (only) the long-poll
    assert client.status()["gateway"]["routes_taken"]["push"] > pushed
    verdict = eventlog.classify(eventlog.read(record))
    assert [(f.server, f.action) for f in verdict.faults if f.at >= killed_at] == [("s1", "kill")]
    assert [f.server for f in verdict.caused if f.detected_at >= killed_at] == ["s1"]
    assert verdict.spurious == [], [f.to_dict(killed_at) for f in verdict.spurious]


def _event(client: Any, kind: str, since: float) -> dict[str, Any]:
    """The first ``kind`` event about s1 since ``since``, waited for."""
    return wait_for(
        lambda: next(
            (
                e
                for e in client.recoveries()["events"]
                if e["type"] == kind and e["server"] == "s1" and e["timestamp"] >= since
            ),
            None,
        ),
        10.0,
        f"s1's {kind} event",
    )
