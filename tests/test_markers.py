"""The ``runtime`` marker is checked, not trusted: a test that starts Ray without it fails."""

from __future__ import annotations

import pytest


def test_starting_ray_without_the_runtime_marker_fails_naming_the_test():
    import ray

    running = ray.is_initialized()  # an instance kept by this worker's earlier runtime tests
    # the address is never reached: the guard refuses before Ray looks for a cluster
    with pytest.raises(AssertionError, match=r"test_markers.py::test_starting_ray.* without the 'runtime'"):
        ray.init(address="127.0.0.1:1")
    assert ray.is_initialized() is running


def test_a_cluster_on_a_kept_ray_without_the_runtime_marker_fails_too():
    import ray

    from failsoft.domain import Server
    from failsoft.runtime.cluster import RayCluster

    running = ray.is_initialized()
    # a kept instance would be reused without any ray.init: the cluster's start is guarded itself
    with pytest.raises(AssertionError, match=r"test_markers.py::test_a_cluster.* without the 'runtime'"):
        RayCluster([Server("s1", "a", 100.0)], num_cpus=2).start()
    assert ray.is_initialized() is running


def test_a_runtime_test_passes_the_guard(request):
    from tests.conftest import ray_refusal

    request.node.add_marker(pytest.mark.runtime)
    assert ray_refusal(request.node) is None
