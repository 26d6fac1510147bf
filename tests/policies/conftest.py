"""Policy tests are pure: they must never start Ray (STYLE 14)."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _forbid_ray(monkeypatch):
    ray = sys.modules.get("ray")
    if ray is not None:

        def refuse(*args, **kwargs):
            raise AssertionError("policy tests must not start Ray")

        monkeypatch.setattr(ray, "init", refuse)
    yield
