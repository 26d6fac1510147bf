"""A stateful graph node's primary loses its model on a live server (HAMS): the core promotes the
backup as for a crash, the graph goes on, and every answer equals a failure-free run's.

The cluster, graph, reference and request loop of :mod:`tests.runtime.test_graph_failover`
(``p -> q``, the SP500 GRU, ``p`` stateful with its primary on s1). Before the 13th request
``failsoft chaos evict s1 p`` (``/admin/chaos/evict``) makes s1's agent drop p's model, as a crashed
model runtime or an eviction would: s1 keeps heartbeating, so no failure detector sees anything.
The request that finds the model gone reports it; the orchestration core switches p to its pinned
backup (route ``promoted``), the dispatcher replays what the backup lacks, and a new backup is placed.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.stateful import sp500_series
from tests.runtime.test_graph_failover import (
    assert_promoted_and_exact,
    chain_config,
    gru_repository,
    one_at_a_time,
)

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
REQUESTS, EVICT_AFTER = 30, 12


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    return gru_repository(tmp_path_factory)  # built once per run for both files


def test_a_primary_that_loses_its_model_on_a_live_server_is_replaced_by_its_backup(zoo, tmp_path):
    config = chain_config(zoo, str(tmp_path / "state"))
    series = sp500_series()
    inputs = [np.asarray([[series[i]]], dtype=np.float32) for i in range(REQUESTS)]
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            evict = functools.partial(client.admin, "evict", server="s1", app="p")
            answers, latency_ms, placed, after = one_at_a_time(
                client, inputs, EVICT_AFTER, evict, "s1 lost p"
            )
            status = client.status()
            events = client.recoveries()["events"]
        finally:
            client.close()
    lost = [e for e in events if e.get("type") == "model_lost"]
    before, at = latency_ms[:EVICT_AFTER], latency_ms[EVICT_AFTER]
    after_ms = np.median(latency_ms[EVICT_AFTER + 1 :])
    print(f"\nlatency ms: before the eviction median {np.median(before):.1f}, the request at it {at:.1f}, "
          f"after median {after_ms:.1f}; found by {[e.get('cause') for e in lost]}; p: {after}")  # fmt: skip
    assert_promoted_and_exact(zoo, inputs, answers, placed, after)
    (s1,) = [s for s in status["servers"] if s["name"] == "s1"]
    assert s1["state"] == "up" and s1["restarts"] == 0 and s1["last_failure"] is None  # it never failed
    (p,) = [a for a in status["apps"] if a["name"] == "p"]
    assert p["route"] == {"server": placed["backup"], "variant": "gru_16"}
    assert [(e["app"], e["server"], e["variant"]) for e in lost] == [("p", "s1", "gru_16")], lost
