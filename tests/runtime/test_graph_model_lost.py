"""A stateful graph node's primary loses its model on a live server (HAMS): the core promotes the
backup as for a crash, the graph goes on, and every answer equals a failure-free run's.

The cluster, graph and reference of :mod:`tests.runtime.test_graph_failover` (``p -> q``, the SP500
GRU, ``p`` stateful with its primary on s1). Before the 13th request ``failsoft chaos evict s1 p``
(``/admin/chaos/evict``) makes s1's agent drop p's model, as a crashed model runtime or an eviction
would: s1 keeps heartbeating, so no failure detector sees anything. The request that finds the model
gone reports it; the orchestration core switches p to its pinned backup (route ``promoted``), the
dispatcher replays what the backup lacks, and a new backup is placed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.stateful import sp500_series
from failsoft.zoo.testing import build_tiny_zoo
from tests.runtime.conftest import wait_for
from tests.runtime.test_graph_failover import FAMILY, chain_config, reference, replication

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
REQUESTS, EVICT_AFTER = 30, 12


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """The SP500 GRU family (cached beside FAILSOFT_TEST_ZOO, shared with test_graph_failover)."""
    root = os.environ.get("FAILSOFT_TEST_ZOO")
    out = Path(root + "-stateful") if root else tmp_path_factory.mktemp("gru-zoo")
    return build_tiny_zoo(out, families=(FAMILY,))


def test_a_primary_that_loses_its_model_on_a_live_server_is_replaced_by_its_backup(zoo, tmp_path):
    config = chain_config(zoo, str(tmp_path / "state"))
    series = sp500_series()
    inputs = [np.asarray([[series[i]]], dtype=np.float32) for i in range(REQUESTS)]
    answers: dict[int, np.ndarray] = {}
    latency_ms: list[float] = []
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
            wait_for(lambda: replication(client)["backup_holds"] is not None, 120.0, "p's backup placed", 0.2)
            placed = replication(client)
            assert placed["primary"] == "s1" and placed["backup"] in ("s2", "s3")
            step = "the requests"
            try:  # a failure says where it came and where replication stood, for the next reader
                for i, x in enumerate(inputs):
                    step = f"request {i + 1} of {REQUESTS} (s1 lost p before request {EVICT_AFTER + 1})"
                    if i == EVICT_AFTER:
                        evicted = client.admin("evict", server="s1", app="p")
                        assert evicted["variants"] == ["gru_16"], evicted
                    raw = client.infer("chain", x, timeout=20.0)  # a slow machine is no failure here
                    answers[int(raw.raw["parameters"]["seq"])] = np.asarray(raw.outputs)
                    latency_ms.append(raw.latency_ms)
                step = "p's state durable again"
                wait_for(lambda: replication(client)["durable"] == REQUESTS, 120.0, step, 0.2)
            except Exception as exc:
                raise AssertionError(f"{step}: {exc!r}; p: {replication(client)}") from exc
            after = replication(client)
            status = client.status()
            events = client.recoveries()["events"]
        finally:
            client.close()
    lost = [e for e in events if e.get("type") == "model_lost"]
    before, at = latency_ms[:EVICT_AFTER], latency_ms[EVICT_AFTER]
    causes = [e.get("cause") for e in lost]
    after_ms = np.median(latency_ms[EVICT_AFTER + 1 :])
    print(f"\nlatency ms: before the eviction median {np.median(before):.1f}, the request at it {at:.1f}, "
          f"after median {after_ms:.1f}; found by {causes}; p: {after}")  # fmt: skip
    assert sorted(answers) == list(range(1, REQUESTS + 1))  # every request answered, in order
    expected = reference(zoo, inputs)
    for seq, got in answers.items():
        np.testing.assert_array_equal(got, expected[seq - 1], err_msg=f"request {seq}; p: {after}")
    assert after["failovers"] == 1 and after["lost"] == 0 and after["divergent"] == 0
    assert after["primary"] == placed["backup"]  # the backup was promoted
    assert after["backup"] not in (None, after["primary"])  # and a new one placed
    (s1,) = [s for s in status["servers"] if s["name"] == "s1"]
    assert s1["state"] == "up" and s1["restarts"] == 0 and s1["last_failure"] is None  # it never failed
    (p,) = [a for a in status["apps"] if a["name"] == "p"]
    assert p["route"] == {"server": placed["backup"], "variant": "gru_16"}
    assert [(e["app"], e["server"]) for e in lost] == [("p", "s1")], lost
