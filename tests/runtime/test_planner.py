"""The planner process answers the controller on a pipe that nothing else may write into.

HiGHS 1.16 prints a copyright banner on file descriptor 1 the first time a process makes a solver;
the planner child once answered on that same descriptor, the controller read the banner as a frame
size, died of a MemoryError, and the demo waited forever for its warm backups.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from failsoft.policies.registry import get_failover_policy
from failsoft.runtime.planner import Planner, _receive, _send
from failsoft.scenario import load_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenario.json"


@pytest.fixture
def scenario():
    return load_scenario(EXAMPLE)


def test_the_planner_process_answers_with_the_in_process_plan(scenario):
    planner = Planner("faillite")
    try:
        plan = asyncio.run(planner.proactive(scenario))
        assert planner._child is not None and planner._child.poll() is None  # answered by the child
    finally:
        planner.close()
    expected = get_failover_policy("faillite").plan_proactive(scenario)
    assert set(plan.warm) == set(expected.warm)
    assert plan.warm  # the example has critical apps: a plan with no backups would prove nothing


def test_a_frame_out_of_step_is_refused_by_its_size_not_read():
    stream = io.BytesIO(b"Running HiGHS 1.16.0 (git hash: f3f113d): Copyright (c) 2026\n" + b"\0" * 64)
    with pytest.raises(pickle.UnpicklingError, match="out of step"):
        _receive(stream)


def test_frames_round_trip():
    stream = io.BytesIO()
    _send(stream, {"warm": [1, 2, 3]})
    stream.seek(0)
    assert _receive(stream) == {"warm": [1, 2, 3]}


def test_a_child_that_prints_junk_is_replaced_by_planning_in_process(scenario, monkeypatch):
    # A fake child (a real process that writes a banner and no frame): the failure a library's stray
    # output causes, which the real child no longer lets happen.
    junk = "import sys; sys.stdout.write('Running HiGHS banner\\n' * 4); sys.stdout.flush(); sys.stdin.read()"
    planner = Planner("faillite")

    def babbling_child():
        planner._child = subprocess.Popen(
            [sys.executable, "-c", junk], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        return planner._child

    monkeypatch.setattr(planner, "_ensure_child", babbling_child)
    try:
        plan = asyncio.run(planner.proactive(scenario))
    finally:
        planner.close()
    assert plan.warm
    assert planner._child is None  # the babbling child was stopped
