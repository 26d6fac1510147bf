"""The LLM tests' fixtures: torch on one thread, and the byte-level pair of
:func:`tests.llm.tinymodels.byte_pair`."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tinymodels import byte_pair


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


@pytest.fixture(scope="session")
def pair():
    return byte_pair()
