"""failsoft across machines, each a network namespace: partitions, healed, and the fence.

One cluster for the module (:class:`~failsoft.runtime.netcluster.NetCluster`): a Ray head and
``failsoft serve --address`` in one namespace, a Ray worker node per server (``s1``, ``s2``) in one
each, all on a private /24; the agents are pinned to their nodes by ``server:<name>``, heartbeats
cross the virtual network to the controller, clients (this process) reach the gateway from the
host's end of the bridge. Real Ray, real processes, real packets dropped; no fakes. Everything the
fixture made (processes by PID, namespaces, links) is removed when the module ends, even on failure.

* a link down under load: detected within the heartbeat bounds, the apps served elsewhere, no
  request failed, no answer from the cut-off server; the link up: the server heard again (same
  agent, no restart), its apps home;
* its heartbeats cut while clients still reach it (a partial partition), with a request in its
  queue: declared failed, and that request answered by the new route, never by the failed server
  (the gateway's fence), however late the failed server's own answer comes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from failsoft.bench.partition import Load
from failsoft.runtime.netcluster import NetCluster

pytestmark = [pytest.mark.runtime, pytest.mark.slow, pytest.mark.timeout(900)]
SUBNET = "10.77.1"  # apart from the benchmark's default (10.77.0), which may run beside
INTERVAL_S, MISSED = 0.1, 3
X = np.zeros(64, dtype=np.float32)


@pytest.fixture(scope="module")
def net(netns_ok, tiny_zoo, tmp_path_factory) -> Iterator[tuple[NetCluster, Any]]:
    work = tmp_path_factory.mktemp("netns")
    state = work / "state" / "netns-test"
    family = {f.name: f for f in tiny_zoo.families()}["digits_mlp"]
    memory = round(2 * family.variant("mlp_l").memory_mb + 1.5 * family.smallest.memory_mb, 3)
    config = {
        "name": "netns-test",
        "repository": str(tiny_zoo.root),
        "state_dir": str(state),
        "servers": [{"name": n, "site": s, "memory_mb": memory, "compute": 4.0}
                    for n, s in (("s1", "a"), ("s2", "b"))],
        "apps": [
            {"name": "crit-1", "family": "digits_mlp", "critical": True, "rate_rps": 2,
             "primary": {"server": "s1", "variant": "mlp_l"}},
            {"name": "best-2", "family": "digits_mlp", "rate_rps": 2,
             "primary": {"server": "s2", "variant": "mlp_l"}},
        ],
        "heartbeat": {"interval_ms": INTERVAL_S * 1000, "missed": MISSED},
        "agents": {"restart": True},
    }  # fmt: skip
    path = work / "netns-test.yaml"
    path.write_text(yaml.safe_dump(config))
    with NetCluster(path, ("s1", "s2"), work, subnet=SUBNET) as cluster:
        cluster.start(state, timeout_s=400)
        with cluster.client(state, timeout=20.0) as client:
            wait_for(lambda: stable(client), 120, "every app at home with its warm backup")
            yield cluster, client


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g} s"
        time.sleep(0.1)
    return got


def stable(client: Any) -> bool:
    status = client.status()
    home = all(a["route"] == a["primary"] for a in status["apps"])
    warm = all(w["state"] == "warm" for a in status["apps"] for w in a["warm_backups"])
    covered = all(a["warm_backups"] for a in status["apps"] if a["critical"])
    return home and warm and covered and all(s["state"] == "up" for s in status["servers"])


def event(client: Any, kind: str, server: str, since: float) -> dict[str, Any] | None:
    events = client.recoveries()["events"]
    return next(
        (e for e in events if e["type"] == kind and e["server"] == server and e["timestamp"] >= since), None
    )


def restarts(client: Any) -> dict[str, int]:
    return {s["name"]: s["restarts"] for s in client.status()["servers"]}


def test_a_partitioned_server_is_detected_in_bounds_and_rejoins_without_a_restart(net):
    cluster, client = net
    before = restarts(client)
    state = cluster.work / "state" / "netns-test"
    load = Load(lambda: cluster.client(state), ["crit-1", "best-2"], {"crit-1": X, "best-2": X}, rate_rps=10)
    load.start(threads=2)
    try:
        time.sleep(2)
        cut = time.time()
        cluster.lab.partition("s1")
        failure = wait_for(lambda: event(client, "failure", "s1", cut), 30, "s1 declared failed")
        bound_s = INTERVAL_S * MISSED
        assert failure["last_heartbeat_at"] <= cut + 0.05  # it beat until the cut, not after
        assert failure["detected_at"] - failure["last_heartbeat_at"] <= bound_s + INTERVAL_S + 0.2
        assert failure["detected_at"] - cut <= bound_s + 0.3, failure
        wait_for(lambda: client.infer("crit-1", X).server == "s2", 10, "crit-1 served by its warm backup")
        time.sleep(3)
        assert {s["name"]: s["state"] for s in client.status()["servers"]} == {"s1": "failed", "s2": "up"}
        healed = time.time()
        cluster.lab.heal("s1")
        wait_for(lambda: event(client, "server_up", "s1", healed), 60, "s1 heard again")
        wait_for(lambda: stable(client), 60, "every app at home again")
        restored = event(client, "restore", "s1", healed)
        time.sleep(1)
    finally:
        load.stop()
    assert restarts(client) == before  # the same agent rejoined: no restart, let alone a storm
    assert restored is not None and restored["app"] == "crit-1"
    failed = [r for r in load.records if r.error is not None]
    assert not failed, failed[:3]
    late = [
        r
        for r in load.records
        if r.server == "s1" and failure["timestamp"] <= r.received < restored["timestamp"]
    ]
    assert not late, late[:3]
    assert sum(r.sent >= cut and r.received < healed for r in load.records) > 10  # served meanwhile


def test_a_server_whose_heartbeats_are_cut_is_fenced_off_though_clients_reach_it(net):
    cluster, client = net
    before = restarts(client)
    client.admin("slow", server="s1", ms=1500)  # a request in its queue outlives the verdict
    try:
        answers: list[Any] = []
        sender = threading.Thread(target=lambda: answers.append(client.infer("crit-1", X, timeout=5.0)))
        sent = time.time()
        sender.start()
        time.sleep(0.2)  # the request is on s1 now (a warm backup on s2 waits)
        cluster.lab.cut("s1")  # every UDP datagram s1 sends is dropped: its heartbeats; Ray's TCP flows
        failure = wait_for(lambda: event(client, "failure", "s1", sent), 30, "s1 declared failed")
        sender.join(timeout=30)
        (answer,) = answers
        assert answer.server == "s2" and answer.attempts >= 2, answer  # not s1's late answer
        assert client.infer("best-2", X).server == "s2"
        assert failure["detected_at"] - failure["last_heartbeat_at"] <= INTERVAL_S * (MISSED + 1) + 0.2
    finally:
        client.admin("slow", server="s1", ms=0)
        uncut = time.time()
        cluster.lab.uncut("s1")
    wait_for(lambda: event(client, "server_up", "s1", uncut), 60, "s1 heard again")
    wait_for(lambda: stable(client), 60, "every app at home again")
    assert restarts(client) == before
    assert client.infer("crit-1", X).server == "s1"
