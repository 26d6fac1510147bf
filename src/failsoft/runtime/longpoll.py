"""Pushed, versioned state: the controller's routing table and event log (Ray Serve LongPollHost).

The gateway keeps a copy of the routing table. Instead of polling, it asks the controller "wake me
when you have something newer than version V" and the controller answers the moment a route changes
(or after a timeout, with what it has). A failover is thus one round trip from the controller's
decision to every gateway, which is what keeps a warm failover's outage near the detection time.

* :class:`VersionedValue` holds the latest value; every :meth:`~VersionedValue.publish` bumps the version.
* :class:`EventLog` keeps the last events with increasing sequence numbers; a reader asks for those
  after the last one it saw.

Both carry an *epoch*, new in every controller process: a gateway holding a version from a previous
controller incarnation is answered at once, whatever the numbers, so it never waits on a version
that the restarted controller has not reached yet.

Timeouts run on an injected :class:`~failsoft.clock.AsyncClock` (:func:`wait_event`), so the
long-poll host and its readers (the gateway's route mirror) are unit-tested on a manual clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from typing import Any

from failsoft.clock import AsyncClock, MonotonicClock


async def wait_event(event: asyncio.Event, timeout_s: float, clock: AsyncClock) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passed on ``clock``; True when it was set."""
    if event.is_set():
        return True
    if timeout_s <= 0:
        return False
    setter = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({setter, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        setter.cancel()
        timer.cancel()
    return event.is_set()


class _Waker:
    """Wakes every waiter at once, then re-arms (one asyncio.Event per generation)."""

    def __init__(self, clock: AsyncClock) -> None:
        self._clock = clock
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        await wait_event(self._event, timeout_s, self._clock)


class VersionedValue:
    """The latest value, a version that grows with every publish, and long-poll readers."""

    def __init__(
        self, value: Any, version: int = 0, epoch: str | None = None, clock: AsyncClock | None = None
    ) -> None:
        self.epoch = epoch or uuid.uuid4().hex[:12]
        self.version = version
        self.value = value
        self._clock = clock or MonotonicClock()
        self._waker: _Waker | None = None
        self.published_at = self._clock.now()  # when this version was published, on ``clock``

    def _lazy_waker(self) -> _Waker:  # created on first use, inside the running event loop
        if self._waker is None:
            self._waker = _Waker(self._clock)
        return self._waker

    def publish(self, value: Any) -> int:
        self.value = value
        self.version += 1
        self.published_at = self._clock.now()
        self._lazy_waker().wake()
        return self.version

    def snapshot(self) -> dict[str, Any]:
        """The value, its version and when it was published (``published_at``, seconds on the
        host's clock: two snapshots of one publisher time what happened between them there,
        whatever the readers' delays)."""
        return {
            "epoch": self.epoch,
            "version": self.version,
            "value": self.value,
            "published_at": self.published_at,
        }

    async def wait_newer(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        """The snapshot as soon as it is newer than ``(epoch, version)``, else at the timeout."""
        if epoch != self.epoch or self.version > version:
            return self.snapshot()
        await self._lazy_waker().wait(timeout_s)
        return self.snapshot()


class EventLog:
    """The last ``capacity`` events, each stamped with ``seq``; readers long-poll for newer ones."""

    def __init__(
        self, capacity: int = 2000, epoch: str | None = None, clock: AsyncClock | None = None
    ) -> None:
        self.epoch = epoch or uuid.uuid4().hex[:12]
        self.seq = 0
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._clock = clock or MonotonicClock()
        self._waker: _Waker | None = None

    def _lazy_waker(self) -> _Waker:
        if self._waker is None:
            self._waker = _Waker(self._clock)
        return self._waker

    def append(self, event: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        stamped = {**event, "seq": self.seq}
        self._events.append(stamped)
        self._lazy_waker().wake()
        return stamped

    def after(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self._events if e["seq"] > seq]

    async def wait_after(self, epoch: str, seq: int, timeout_s: float) -> dict[str, Any]:
        """Events after ``seq`` (all retained ones when the epoch changed), waiting up to the timeout."""
        if epoch != self.epoch:
            seq = 0
        if self.seq <= seq:
            await self._lazy_waker().wait(timeout_s)
        return {"epoch": self.epoch, "seq": self.seq, "events": self.after(seq)}
