"""One embedded Ray instance for cluster after cluster (``cluster.keep_embedded``, on in the test
session): a cluster stopped and started again on the same instance serves with the same names
(controller, agents), and a cluster of other settings, or started in another environment, gets an
instance of its own."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import psutil
import pytest
import ray
from ray._private import ray_constants

from failsoft.domain import Server
from failsoft.runtime.cluster import RayCluster
from failsoft.runtime.config import config_from_dict
from tests.runtime.conftest import serving

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


def _config(tiny_zoo, tmp_path_factory):
    return config_from_dict(
        {
            "name": "kept-ray-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": "s1", "site": "a", "memory_mb": 50, "compute": 4.0}],
            "apps": [
                {"name": "app", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
            ],
            "gateway": {"port": 0},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )


def _answer(client, tiny_zoo) -> np.ndarray:
    x = np.random.default_rng(3).random(
        (1, *tiny_zoo.load("digits_mlp", "mlp_s").input_shape), dtype=np.float32
    )
    return client.infer("app", x).outputs


def test_a_cluster_started_again_on_the_kept_instance_serves_under_the_same_names(tiny_zoo, tmp_path_factory):
    config = _config(tiny_zoo, tmp_path_factory)
    with serving(config) as (_, client):
        gcs = ray.get_runtime_context().gcs_address
        first = _answer(client, tiny_zoo)
    assert ray.is_initialized()  # kept: the cluster stopped its actors, not Ray
    with serving(config) as (_, client):  # the controller's and agent's names are free again
        assert ray.get_runtime_context().gcs_address == gcs
        np.testing.assert_array_equal(_answer(client, tiny_zoo), first)
        assert client.status()["servers"][0]["state"] == "up"


def test_other_settings_or_another_environment_get_an_instance_of_their_own(monkeypatch):
    servers = [Server("s1", "a", 100.0)]

    def gcs_of(cluster: RayCluster) -> str:
        cluster.start()
        try:
            return ray.get_runtime_context().gcs_address
        finally:
            cluster.shutdown()

    kept = gcs_of(RayCluster(servers, num_cpus=2))
    assert gcs_of(RayCluster(servers, num_cpus=2)) == kept
    other = gcs_of(RayCluster(servers, num_cpus=3))  # not what the kept instance was started with
    assert other != kept and ray.is_initialized()
    monkeypatch.setenv("FAILSOFT_KEPT_RAY_TEST", "1")  # would reach no worker of the kept instance
    assert gcs_of(RayCluster(servers, num_cpus=3)) != other


def _idle_workers() -> list[str]:
    """The Python workers this process's embedded Ray instance has started that no actor took."""
    node = ray._private.worker._global_node
    raylet = psutil.Process(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)
    idle = []
    for proc in raylet.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.cmdline()[:1] == ["ray::IDLE"]:
                idle.append(f"{proc.pid}: ray::IDLE")
    return idle


def test_the_embedded_instance_starts_no_idle_workers(tiny_zoo, tmp_path_factory):
    """Ray starts a Python worker per CPU ahead of any task (about a second of a core each, at
    every instance's start); every agent asks for an environment of its own, so none would take one."""
    with serving(_config(tiny_zoo, tmp_path_factory)) as (_, client):
        assert client.status()["servers"][0]["state"] == "up"
        time.sleep(1.0)  # a prestart would have begun by now: the raylet starts them at once
        assert _idle_workers() == []
