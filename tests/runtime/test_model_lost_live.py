"""A single app loses its model on a live server under light load: no request fails.

A real embedded cluster (Ray, a controller, two agents with real digits models, the HTTP gateway),
``cam`` on s1 with no warm backup anywhere (``warm_replicas: 0``), so the orchestration core
reloads the model in place. Under a light load (about 20 requests a second, at most 4 in flight),
``failsoft chaos evict s1 cam`` (``/admin/chaos/evict``) makes s1's agent drop the model while it
heartbeats on: its queued calls are answered ``ModelNotLoadedError`` (the batch running then
finishes), the gateway's call primitive tells the controller (``report_model_lost``), the core
unroutes ``cam`` while it reloads it on s1 and routes it again as a new route, and the requests
waiting meanwhile are sent there. So no request fails; those that found the model gone are
answered at their second attempt. With the core as it was before (the route kept while the model
reloads, never published again) the request that found the loss failed at its 10 s deadline
(``NoRouteError``: the route never changed, so the gateway never retried it), which this test
then reports.
"""

from __future__ import annotations

import numpy as np
import pytest

from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadSpec, LoadThread
from tests.runtime.conftest import serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    family = {f.name: f for f in tiny_zoo.families()}["digits_mlp"]
    memory = round(2 * family.variant("mlp_l").memory_mb, 3)
    config = config_from_dict(
        {
            "name": "model-lost-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": n, "memory_mb": memory, "compute": 4.0} for n in ("s1", "s2")],
            "apps": [
                {"name": "cam", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_l"}}
            ],
            "failover": {"warm_replicas": 0},  # no warm backup: the core reloads in place
            "gateway": {"port": 0},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with serving(config) as running:
        yield running


def test_a_single_apps_model_evicted_under_light_load_fails_no_request(cluster):
    session, client = cluster
    spec = LoadSpec(session.url, {"cam": (64,)}, 0.05, 10.0, 120.0, max_in_flight=4)
    traffic = LoadThread(spec).start()
    try:
        wait_for(lambda: len(traffic.samples) >= 40, 60.0, "40 answers before the eviction", 0.05)
        evicted = client.admin("evict", server="s1", app="cam")
        count = len(traffic.samples)
        wait_for(lambda: len(traffic.samples) >= count + 60, 60.0, "60 answers after the eviction", 0.05)
    finally:
        samples = traffic.stop(30.0)
    assert evicted["variants"] == ["mlp_l"]
    failed = [s.error for s in samples if not s.ok]
    retried = [s for s in samples if s.attempts > 1]
    events = client.recoveries()["events"]
    lost = [e for e in events if e.get("type") == "model_lost"]
    reload = [e for e in events if e.get("type") == "failover" and e.get("kind") == "reload"]
    at = [s.latency_ms for s in samples if s.sent >= evicted["at"] - 1.0]
    print(
        f"\n{len(samples)} requests, {len(failed)} failed, {len(retried)} retried; found by "
        f"{[e.get('cause') for e in lost]}; reloaded in {[e.get('route_ms') for e in reload]} ms; "
        f"latency ms after the eviction: median {np.median(at):.1f}, max {max(at):.1f}"
    )
    assert not failed, failed[:3]
    assert [(e["app"], e["server"], e["variant"]) for e in lost] == [("cam", "s1", "mlp_l")], lost
    assert [(e["server"], e["variant"]) for e in reload] == [("s1", "mlp_l")], reload
    assert all(s.server == "s1" for s in samples)  # reloaded in place: no other server served it
    status = client.status()
    (s1,) = [s for s in status["servers"] if s["name"] == "s1"]
    assert s1["state"] == "up" and s1["last_failure"] is None  # the server never failed
    (cam,) = [a for a in status["apps"] if a["name"] == "cam"]
    assert cam["route"] == {"server": "s1", "variant": "mlp_l"}
