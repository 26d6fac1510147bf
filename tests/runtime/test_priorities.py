"""Agents run model loads in threads lowered *relative* to their own niceness (never raised)."""

from __future__ import annotations

import os
import threading

import pytest

from failsoft.orchestration.loads import BACKGROUND_NICE, LOAD_NICE
from failsoft.runtime.agent import _run_at_priority
from failsoft.runtime.priority import MAX_NICE

pytestmark = pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread niceness is Linux's")


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("offset", [LOAD_NICE, BACKGROUND_NICE])
def test_work_runs_offset_below_the_caller_and_the_caller_keeps_its_priority(offset):
    before = _own_nice()
    assert _run_at_priority(offset, _own_nice) == min(before + offset, MAX_NICE)
    assert _own_nice() == before


def test_zero_offset_runs_in_the_calling_thread():
    caller = threading.get_native_id()
    assert _run_at_priority(0, threading.get_native_id) == caller


def test_an_error_in_the_work_reaches_the_caller():
    def fail() -> None:
        raise ValueError("disk gone")

    with pytest.raises(ValueError, match="disk gone"):
        _run_at_priority(LOAD_NICE, fail)
