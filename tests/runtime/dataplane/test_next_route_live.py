"""The next route without the controller, live: an agent is SIGKILLed with requests in flight on
its data-plane connection while the controller is frozen (SIGSTOP), so that no route of the
controller can reach the gateway; the requests are answered by the app's warm backup, at the
connection's end, before the controller is let go. Once it is, it fails the server over to the
same backup, and requests follow its route.

A real embedded cluster (Ray, controller, two agents serving the real digits MLP, the gateway); s1
is slowed (5 s a batch) so that requests are queued there when it dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.runtime.conftest import serving, wait_for
from tests.runtime.dataplane.conftest import critical_app_on_s1

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
IN_FLIGHT = 4


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    config = critical_app_on_s1(tiny_zoo, tmp_path_factory.mktemp("state"), "next-route-test")
    with serving(config) as running:
        yield running


@contextlib.contextmanager
def frozen(pid: int):
    """The process stopped (SIGSTOP) for the block, continued after whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_requests_in_flight_on_a_killed_agent_are_answered_by_its_warm_backup_before_any_route(cluster):
    _, client = cluster

    def ready():
        status = client.status()
        (app,) = status["apps"]
        warm = [w for w in app["warm_backups"] if w["state"] == "warm" and w["server"] == "s2"]
        return status if app["route"]["server"] == "s1" and warm and status["idle"] else None

    status = wait_for(ready, 90.0, "crit on s1 with a warm backup on s2, the controller idle")
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    assert client.infer("crit", x).server == "s1"
    client.admin("slow", server="s1", ms=5000)  # one batch: every request waits 5 s
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        calls = [pool.submit(client.infer, "crit", x, 20.0) for _ in range(IN_FLIGHT)]
        time.sleep(0.6)  # sent, and waiting in s1's queue
        assert not any(c.done() for c in calls)
        with frozen(status["controller"]["pid"]):
            killed_at = client.admin("kill", server="s1")["killed"][0]["at"]
            answers = [c.result(timeout=4.0) for c in calls]  # well within the gateway's 5 s hold
            answered_at = time.time()
            after = client.infer("crit", x, 5.0)  # a request after the end skips s1 altogether
    assert [(a.server, a.kind) for a in answers] == [("s2", "backup")] * IN_FLIGHT
    assert (after.server, after.kind) == ("s2", "backup")
    took_ms = (answered_at - killed_at) * 1e3
    print(f"kill -> {IN_FLIGHT} in-flight requests answered by the backup: {took_ms:.0f} ms")
    moves = [m for m in client.recoveries()["moves"] if m["left"] == "s1" and m["sent_at"] >= killed_at]
    assert sorted(m["via"] for m in moves) == ["backup"] * (IN_FLIGHT + 1)
    # the controller's route came after every answer: it was frozen until then
    failover = wait_for(
        lambda: next((e for e in client.recoveries()["events"] if e["type"] == "failover"), None),
        15.0,
        "the controller's failover of crit",
    )
    assert (failover["server"], failover["kind"]) == ("s2", "warm")
    assert failover["timestamp"] > answered_at
    wait_for(lambda: client.infer("crit", x, 5.0).kind == "warm", 15.0, "requests on the controller's route")
