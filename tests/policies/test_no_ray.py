"""The guard in conftest.py really forbids Ray (it once patched ``ray.init`` only when Ray was
already imported, which in a policy test it never is: a no-op)."""

import pytest


def test_importing_ray_in_a_policy_test_gives_a_module_that_fails_the_test():
    import ray

    with pytest.raises(AssertionError, match="policy tests must not use Ray"):
        ray.is_initialized()  # the real one would answer False and start nothing
    with pytest.raises(AssertionError, match="must not use Ray"):
        ray.init()
