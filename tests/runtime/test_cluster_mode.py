"""Cluster mode (``failsoft serve --address``): a multi-node Ray cluster, one node per server.

Ray's own multi-node test harness (``ray.cluster_utils.Cluster``) starts a head node and one more
node (a raylet of its own) per server, each offering resource ``server:<name>``, all on 127.0.0.1.
Removing a node is what losing that machine does to Ray: its raylet and every worker on it go away.
The test checks that each agent lives on its server's node (removing s1's node fails s1 and nothing
else) and that its apps fail over as in embedded mode. The harness stops every process it started.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from failsoft.client import Client
from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from tests.runtime.conftest import wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
SERVERS = (("s1", "a"), ("s2", "b"), ("s3", "b"))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    nodes = {}
    try:
        for server, _ in SERVERS:
            nodes[server] = cluster.add_node(
                num_cpus=1, node_ip_address="127.0.0.1", resources={f"server:{server}": 1}
            )
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        cluster.shutdown()


def _config(tiny_zoo: Any, state_dir: Any, servers: tuple[tuple[str, str], ...] = SERVERS) -> Any:
    family = {f.name: f for f in tiny_zoo.families()}["digits_mlp"]
    memory = round(2 * family.variant("mlp_l").memory_mb + 1.5 * family.smallest.memory_mb, 3)
    return config_from_dict(
        {
            "name": "cluster-mode-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": s, "memory_mb": memory, "compute": 4.0} for n, s in servers],
            "apps": [
                {"name": "crit-1", "family": "digits_mlp", "critical": True, "rate_rps": 2,
                 "primary": {"server": "s1", "variant": "mlp_l"}},
                {"name": "best-1", "family": "digits_mlp", "rate_rps": 2,
                 "primary": {"server": "s1", "variant": "mlp_l"}},
                {"name": "best-2", "family": "digits_mlp", "rate_rps": 2,
                 "primary": {"server": "s2", "variant": "mlp_l"}},
            ],
            "failover": {"policy": "faillite", "alpha": 0.1},
            "gateway": {"port": 0},
            "agents": {"restart": False},
            "state_dir": str(state_dir),
        },
        source="test",
    )  # fmt: skip


def test_a_server_no_node_offers_is_refused_with_the_command_that_fixes_it(ray_cluster, tiny_zoo, tmp_path):
    cluster, _ = ray_cluster
    config = _config(tiny_zoo, tmp_path, (*SERVERS, ("s9", "c")))
    session = Session(config, address=cluster.address)
    with pytest.raises(ConfigError, match=r"no node .* offers resource 'server:s9'.*ray start"):
        session.start()
    session.stop()


def test_agents_live_on_their_servers_nodes_and_losing_a_node_fails_over_its_apps(
    ray_cluster, tiny_zoo, tmp_path
):
    cluster, nodes = ray_cluster
    session = Session(_config(tiny_zoo, tmp_path), address=cluster.address).start()
    client = session.client(timeout=20.0)
    try:
        x = np.zeros(64, dtype=np.float32)
        wait_for(lambda: _stable(client), 90.0, "every app at home with its warm backups")
        assert client.infer("crit-1", x).server == "s1"

        t_lost = time.time()
        cluster.remove_node(nodes["s1"], allow_graceful=False)  # the machine of s1 is gone

        def since() -> list[dict[str, Any]]:
            return [e for e in client.recoveries()["events"] if e["timestamp"] >= t_lost]

        wait_for(
            lambda: {"crit-1", "best-1"} <= {e["app"] for e in since() if e["type"] == "failover"},
            60.0,
            "crit-1 and best-1 failed over",
        )
        events = since()
        failed = {e["server"] for e in events if e["type"] == "failure"}
        assert failed == {"s1"}  # only the agent on the removed node died
        kinds = {e["app"]: e["kind"] for e in events if e["type"] == "failover"}
        assert kinds == {"crit-1": "warm", "best-1": "progressive"}
        servers = {s["name"]: s["state"] for s in client.status()["servers"]}
        assert servers == {"s1": "failed", "s2": "up", "s3": "up"}
        for app in ("crit-1", "best-1", "best-2"):
            answer = client.infer(app, x)
            assert answer.server in {"s2", "s3"}
    finally:
        client.close()
        session.stop()


def _stable(client: Client) -> bool:
    status = client.status()
    home = all(a["route"] == a["primary"] for a in status["apps"])
    warm = all(w["state"] == "warm" for a in status["apps"] for w in a["warm_backups"])
    covered = all(a["warm_backups"] for a in status["apps"] if a["critical"])
    return home and warm and covered
