"""A graph service (HAMS's request path) on a real cluster: every request walks the graph through
real agents, and a stateless node's killed server fails over as for any app, no request failing.

The graph fans each request out to two entry nodes, ``a`` (app d0 on s1) and ``b`` (app d1 on s2),
both the tiny zoo's ``digits_mlp/mlp_m``; its answer joins the two sinks' logits side by side.
(A stateful node's failover, its backup promoted: ``test_graph_failover.py``.)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from failsoft.runtime.config import config_from_dict
from failsoft.runtime.loadgen import LoadSpec, LoadThread
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.digits import load_digits_split
from tests.runtime.conftest import wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


def graph_config(repo: ModelRepository, state_dir: str) -> Any:
    family = {f.name: f for f in repo.families()}["digits_mlp"]
    memory = round(4 * family.variant("mlp_l").memory_mb, 3)
    homes = {"d0": "s1", "d1": "s2"}
    return config_from_dict(
        {
            "name": "graph-test",
            "repository": str(repo.root),
            "servers": [
                {"name": n, "site": site, "memory_mb": memory, "compute": 4.0}
                for n, site in (("s1", "a"), ("s2", "b"), ("s3", "c"))
            ],
            "apps": [
                {
                    "name": app,
                    "family": "digits_mlp",
                    "rate_rps": 20,
                    "primary": {"server": home, "variant": "mlp_m"},
                }
                for app, home in homes.items()
            ],
            "services": [
                {
                    "name": "pair",
                    "mode": "graph",
                    "members": ["d0", "d1"],
                    "params": {
                        "nodes": [{"name": "a", "app": "d0"}, {"name": "b", "app": "d1"}],
                        "edges": [],
                    },
                }
            ],
            "failover": {"policy": "faillite", "alpha": 0.1},
            "gateway": {"port": 0},
            "agents": {"restart": True, "drain_ms": 100},
            "state_dir": state_dir,
        },
        source="test",
    )


def test_a_killed_stateless_node_fails_over_and_no_request_of_the_graph_fails(tiny_zoo, tmp_path):
    config = graph_config(tiny_zoo, str(tmp_path / "state"))
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=20.0)
        try:
            wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
            split = load_digits_split()
            raw = client.infer("pair", split.x_test[:32])
            logits = np.asarray(raw.outputs)
            assert logits.shape == (32, 20)  # both sinks' logits, side by side
            for half in (logits[:, :10], logits[:, 10:]):
                assert np.mean(half.argmax(axis=1) == split.y_test[:32]) > 0.8

            spec = LoadSpec(session.url, {"pair": (64,)}, 0.01, 8.0, 20.0, max_in_flight=8)
            traffic = LoadThread(spec).start()
            time.sleep(1.5)
            t_kill = client.admin("kill", server="s2")["killed"][0]["at"]

            def moved() -> bool:
                (index,) = [e for e in client.repository_index() if e["name"] == "pair"]
                return index["state"] == "READY" and index["nodes"]["b"]["server"] != "s2"

            wait_for(moved, 30.0, "node b on a new server", 0.1)
            time.sleep(1.0)
            samples = traffic.stop()
        finally:
            client.close()
    assert all(s.ok for s in samples), [s.error for s in samples if not s.ok][:3]
    assert any(s.sent >= t_kill for s in samples)
