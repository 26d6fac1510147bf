"""Waiting in asyncio tests on the condition itself, never on a count of event-loop passes.

``await asyncio.sleep(0)`` once or twice "so that the task starts" holds only while the code under
test takes that many passes to get there; one more ``await`` inside it and the test asserts too
early. :func:`until` lets the loop run until what the test waits for is true, and fails naming it
when it never is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

MAX_PASSES = 10_000  # event-loop passes before giving up: far more than any wait here needs


async def until(condition: Callable[[], Any], what: str) -> None:
    """Let other tasks run until ``condition()`` is true; AssertionError naming ``what`` otherwise."""
    for _ in range(MAX_PASSES):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")
