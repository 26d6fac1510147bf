"""Replicas and autoscaling on a real embedded cluster: Ray, a controller, 3 agents with real digits
models, the HTTP gateway; driven through HTTP, the SDK and the admin API.

* ``hot`` has ``replicas: 2``: both servers answer its requests; its replica's server is killed
  under load, and no request fails (those the dead server held are retried on the route), then the
  core places a replica again;
* ``auto`` autoscales (1 to 2 replicas, 1 request in flight per replica): a load it cannot keep at
  that target scales it out, the load's end scales it back in, with no failed request.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
import pytest

from failsoft.client import Client
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadSpec, LoadThread, Sample
from failsoft.runtime.session import Session
from tests.runtime.conftest import serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0.5,
    "downscale_delay_s": 2.0,
    "look_back_s": 0.5,
}


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    family = {f.name: f for f in tiny_zoo.families()}["digits_mlp"]
    memory = round(2 * family.variant("mlp_l").memory_mb + 1.5 * family.smallest.memory_mb, 3)
    config = config_from_dict(
        {
            "name": "replicas-test",
            "repository": str(tiny_zoo.root),
            "servers": [
                {"name": n, "site": n, "memory_mb": memory, "compute": 4.0} for n in ("s1", "s2", "s3")
            ],
            "apps": [
                {
                    "name": "hot",
                    "family": "digits_mlp",
                    "replicas": 2,
                    "primary": {"server": "s1", "variant": "mlp_l"},
                },
                {
                    "name": "auto",
                    "family": "digits_mlp",
                    "autoscaling": AUTOSCALING,
                    "primary": {"server": "s3", "variant": "mlp_l"},
                },
            ],
            "gateway": {"port": 0},
            "agents": {"restart": True, "drain_ms": 100},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with serving(config) as running:
        yield running


def app_status(client: Client, name: str) -> dict[str, Any]:
    return next(a for a in client.status()["apps"] if a["name"] == name)


def replicas(client: Client, name: str, count: int, route: str | None = None) -> list[str]:
    """Wait until ``count`` servers serve ``name`` (its route ``route`` when given); them, route first."""

    def check() -> list[str] | None:
        status = client.status()
        app = next(a for a in status["apps"] if a["name"] == name)
        up = all(s["state"] == "up" for s in status["servers"])
        serving = app["replicas"]["serving"]
        at = route is None or serving[:1] == [route]
        return serving if up and at and len(serving) == count and not app["replicas"]["loading"] else None

    return wait_for(check, 60.0, f"{name} served by {count} servers (route: {route or 'any'})", 0.1)


def load(session: Session, app: str, seconds: float, in_flight: int) -> LoadThread:
    spec = LoadSpec(session.url, {app: (64,)}, 0.005, 10.0, seconds, max_in_flight=in_flight)
    return LoadThread(spec).start()


def failed(samples: list[Sample]) -> list[str]:
    return [f"{s.error}" for s in samples if not s.ok]


def test_replicas_2_serves_from_both_servers(cluster):
    session, client = cluster
    (route, replica) = replicas(client, "hot", 2)
    assert route == "s1" and replica in ("s2", "s3")
    samples = _run(session, "hot", 200, 4)
    assert samples and not failed(samples), failed(samples)[:3]
    by_server = Counter(s.server for s in samples)
    assert set(by_server) == {route, replica} and min(by_server.values()) > len(samples) / 5, by_server
    metrics = httpx.get(f"{session.url}/metrics").text
    assert 'failsoft_app_replicas{app="hot"} 2.0' in metrics
    assert 'failsoft_app_ongoing_requests{app="hot"}' in metrics


def _run(session: Session, app: str, count: int, in_flight: int) -> list[Sample]:
    """About ``count`` answers to ``app`` (the load thread's start is slow on a busy machine)."""
    traffic = load(session, app, 120.0, in_flight)
    flowing(traffic, count)
    return traffic.stop(30.0)


def flowing(traffic: LoadThread, count: int) -> None:
    wait_for(lambda: len(traffic.samples) >= count, 60.0, f"{count} answers", 0.05)


def test_a_replica_killed_under_load_fails_no_request_and_is_replaced(cluster):
    session, client = cluster
    (route, replica) = replicas(client, "hot", 2)
    samples, _ = _kill_under_load(session, client, replica)
    retried = [s for s in samples if s.attempts > 1]
    print(f"replica {replica} killed: {len(samples)} requests, {len(retried)} retried, 0 failed")
    assert all(s.server == route for s in retried)  # those the dead server held went to the route
    serving = replicas(client, "hot", 2)  # replaced: on the third server, or the killed one back
    assert serving[0] == route


def test_the_routes_server_killed_under_load_switches_to_a_replica_with_no_failed_request(cluster):
    session, client = cluster
    (route, replica) = replicas(client, "hot", 2)
    samples, t_kill = _kill_under_load(session, client, route)
    failover = next(
        e
        for e in client.recoveries()["events"]
        if e["type"] == "failover" and e["app"] == "hot" and e["timestamp"] >= t_kill
    )
    assert (failover["kind"], failover["server"]) == ("warm", replica)
    retried = [s for s in samples if s.attempts > 1]
    print(f"route {route} killed: {len(samples)} requests, {len(retried)} retried, 0 failed")
    assert all(s.server != route for s in retried)
    replicas(client, "hot", 2, route=route)  # back home once the agent restarted, 2 serving


def _kill_under_load(session: Session, client: Client, server: str) -> tuple[list[Sample], float]:
    """Load on ``hot``, ``server`` killed once 50 answers came; every sample, and when it was
    killed. No request may fail: those the dead server held are retried on another active route."""
    traffic = load(session, "hot", 60.0, in_flight=4)
    flowing(traffic, 50)
    t_kill = client.admin("kill", server=server)["killed"][0]["at"]
    time.sleep(4.5)
    samples = traffic.stop(30.0)
    assert [s for s in samples if s.sent >= t_kill], "no request sent after the kill"
    assert not failed(samples), failed(samples)[:3]
    return samples, t_kill


def test_autoscaling_scales_out_under_load_and_back_in_after_it(cluster):
    session, client = cluster
    assert replicas(client, "auto", 1) == ["s3"]
    for server in ("s1", "s2", "s3"):
        client.admin("slow", server=server, ms=20)  # 4 requests in flight: more than 1 replica keeps
    t0 = time.time()
    try:
        traffic = load(session, "auto", 120.0, in_flight=4)
        out = replicas(client, "auto", 2)
        metrics = httpx.get(f"{session.url}/metrics").text
        time.sleep(1.0)
        samples = traffic.stop(30.0)
    finally:
        for server in ("s1", "s2", "s3"):
            client.admin("slow", server=server, ms=0)
    assert len(out) == 2 and 'failsoft_app_replicas{app="auto"} 2.0' in metrics
    back = replicas(client, "auto", 1)
    assert back == ["s3"]
    assert samples and not failed(samples), failed(samples)[:3]
    assert {s.server for s in samples} == set(out)  # the new replica took requests
    scale = [e for e in client.recoveries()["events"] if e["type"] == "scale" and e["timestamp"] >= t0]
    assert [(e["app"], e["previous"], e["replicas"], e["reason"]) for e in scale] == [
        ("auto", 1, 2, "autoscale"),
        ("auto", 2, 1, "autoscale"),
    ]
