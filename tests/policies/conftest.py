"""Policy tests are pure: they must never use Ray.

While a policy test runs, ``import ray`` gives a stand-in whose every attribute fails the test, and
if Ray was already imported (by a runtime test earlier in the session), its ``init`` fails too: code
that kept a reference to the real module cannot start a cluster either.
"""

import sys
import types

import pytest

REFUSAL = "policy tests must not use Ray"


class _ForbiddenRay(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):  # introspection (hypothesis, inspect)
            raise AttributeError(name)
        raise AssertionError(f"{REFUSAL} (ray.{name})")


@pytest.fixture(autouse=True)
def _forbid_ray(monkeypatch):
    real = sys.modules.get("ray")
    if real is not None:

        def refuse(*args, **kwargs):
            raise AssertionError(REFUSAL)

        monkeypatch.setattr(real, "init", refuse)
    monkeypatch.setitem(sys.modules, "ray", _ForbiddenRay("ray"))
    yield
