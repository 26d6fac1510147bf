"""CLI fixtures: the tiny real model repository the zoo tests build (once per session)."""

from tests.zoo.conftest import tiny_zoo  # noqa: F401
