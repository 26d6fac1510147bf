"""The ``runtime`` marker is checked, not trusted: a test that starts Ray without it fails."""

from __future__ import annotations

import pytest


def test_starting_ray_without_the_runtime_marker_fails_naming_the_test():
    import ray

    # the address is never reached: the guard refuses before Ray looks for a cluster
    with pytest.raises(AssertionError, match=r"test_markers.py::test_starting_ray.* without the 'runtime'"):
        ray.init(address="127.0.0.1:1")
    assert not ray.is_initialized()


def test_a_runtime_test_passes_the_guard(request):
    from tests.conftest import ray_refusal

    request.node.add_marker(pytest.mark.runtime)
    assert ray_refusal(request.node) is None
