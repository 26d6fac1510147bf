"""Whether the gateway hears its controller, reported once per outage.

The gateway talks to the controller over three streams: the route long-poll, the event long-poll
and the stats poll. While the controller is away (it crashed and Ray restarts it, or it is too busy
to answer), the gateway keeps serving with its last routing table, and every stream retries. An
operator must learn of it without drowning: :class:`ControllerLink` logs one WARNING when the first
stream fails after all were well, DEBUG for every further failure, and one INFO when every stream
answers again. :meth:`ControllerLink.retry` is the streams' one retry loop: back off 20 ms doubling
to 1 s between failures, on the injected clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from failsoft.clock import AsyncClock

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.02, 1.0


class ControllerLink:
    """The health of the gateway's streams to the controller."""

    def __init__(self) -> None:
        self._failing: dict[str, str] = {}  # stream -> its last error
        self._heard = False

    @property
    def connected(self) -> bool:
        """The controller answered, and no stream fails since."""
        return self._heard and not self._failing

    @property
    def failing(self) -> dict[str, str]:
        return dict(self._failing)

    def ok(self, stream: str) -> None:
        self._heard = True
        if self._failing.pop(stream, None) is not None and not self._failing:
            log.info("the controller answers again (%s)", stream)

    def failed(self, stream: str, exc: BaseException) -> None:
        outage_starts = not self._failing
        self._failing[stream] = f"{type(exc).__name__}: {exc}"
        if outage_starts:
            log.warning(
                "the controller does not answer: %s failed (%s); serving with the last routing table "
                "until it does",
                stream,
                self._failing[stream],
            )
        else:
            log.debug("%s failed while the controller is away: %s", stream, exc)

    async def retry(self, stream: str, call: Callable[[], Awaitable[T]], clock: AsyncClock) -> T:
        """``call()``'s answer, calling again after each failure (reported) with a growing backoff."""
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                answer = await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # controller down or restarting: the caller serves what it has
                self.failed(stream, exc)
                await clock.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self.ok(stream)
            return answer
