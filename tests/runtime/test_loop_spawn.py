"""Background tasks of the controller and the dispatchers (``failsoft.runtime.loop.spawn``): a
failure is logged when it happens, naming the task, not left to asyncio's "exception was never
retrieved" at garbage collection (or never, while a reference is held)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from failsoft.runtime.loop import spawn


def test_a_failed_task_is_logged_at_once_with_its_name_and_let_go(caplog: pytest.LogCaptureFixture) -> None:
    tasks: set[asyncio.Task[None]] = set()

    async def broken() -> None:
        raise RuntimeError("state unreadable")

    async def body() -> None:
        task = spawn(broken(), "graph-dag-place", tasks)
        assert tasks == {task}  # held while it runs
        # spawn's done callback was added before this wait's: it has run when the wait returns
        await asyncio.gather(task, return_exceptions=True)
        assert not tasks

    with caplog.at_level(logging.ERROR, logger="failsoft.runtime.loop"):
        asyncio.run(body())
    (record,) = caplog.records
    assert "graph-dag-place failed" in record.getMessage()
    assert record.exc_info is not None and "state unreadable" in str(record.exc_info[1])


def test_a_cancelled_task_is_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    tasks: set[asyncio.Task[None]] = set()

    async def body() -> None:
        task = spawn(asyncio.sleep(10), "waits", tasks)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not tasks

    with caplog.at_level(logging.ERROR, logger="failsoft.runtime.loop"):
        asyncio.run(body())
    assert not caplog.records
