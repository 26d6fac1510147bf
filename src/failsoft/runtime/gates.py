"""Per-server load slots with priorities: what loads first when a failover needs many.

FailLite's progressive failover (3.3) serves every recovered app as soon as possible on a small
variant, then upgrades in the background, one upgrade at a time per server. On a server receiving
many apps, the order of loads is therefore part of the MTTR: a :class:`LoadGate` lets at most
``slots`` loads run at once on a server and starts waiting loads by priority (lowest first, then
arrival), so the first variants of critical apps go before the others, and upgrades last.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import IntEnum


class Priority(IntEnum):
    CRITICAL = 0  # first (or cold) variant of a critical app's failover
    FAILOVER = 1  # first (or cold) variant of any other app's failover
    PRIMARY = 2  # deploy, return home
    WARM = 3  # warm backups
    UPGRADE = 4  # progressive upgrades to the final variant


class LoadGate:
    """At most ``slots`` holders at once; waiters are admitted by (priority, arrival)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a load gate needs at least one slot, got {slots}")
        self.slots = slots
        self._busy = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiting if not f.done())

    @asynccontextmanager
    async def slot(self, priority: int) -> AsyncIterator[None]:
        if self._busy < self.slots and not self.waiting:
            self._busy += 1
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (priority, next(self._arrival), future))
            try:
                await future  # the releasing holder hands its slot over
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self._busy -= 1
