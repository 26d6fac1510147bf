"""Client notification (FailLite 4: "asynchronously informs the applications' clients ... using websockets").

The controller appends events to its log; the gateway's :class:`EventHub` long-polls that log and
fans each event out to every ``/v2/events`` websocket subscriber. Event types:

* ``failure``: a server failed (one event per app it served: ``app``, ``server``, ``variant`` it
  served, ``accuracy``, ``detected_at``);
* ``failover``: the app is served again, at ``server`` on ``variant`` (``kind``: warm, progressive or
  cold; ``route_ms``: detection to route published, load time included: FailLite's MTTR);
* ``upgrade``: a progressive failover switched to its final variant;
* ``restore``: the app is back on its primary;
* also ``unrecovered``, ``server_up`` and ``ready``.

The hub holds at most ``max_subscribers`` subscribers (the gateway refuses more with 503); a
subscriber too slow to keep up (its queue full) is dropped rather than slowing the others (its queue
then holds only ``None``: the gateway closes that websocket), and one whose client left is removed
at once (the gateway watches each websocket for its close).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from failsoft.clock import AsyncClock
from failsoft.runtime.gateway.link import ControllerLink

if TYPE_CHECKING:
    from failsoft.runtime.cluster import ControllerRef

log = logging.getLogger(__name__)
QUEUE_SIZE = 1000
MAX_SUBSCRIBERS = 256
POLL_S = 10.0
STREAM = "event long-poll"
Feed = asyncio.Queue[dict[str, Any] | None]  # a subscriber's events; None: it was dropped


class EventHub:
    def __init__(
        self,
        controller: ControllerRef,
        on_event: Callable[[dict[str, Any]], None],
        clock: AsyncClock,
        link: ControllerLink | None = None,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        self.controller = controller
        self.on_event = on_event
        self.clock = clock
        self.link = link or ControllerLink()
        self.max_subscribers = max_subscribers
        self.epoch = ""
        self.seq = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=QUEUE_SIZE)
        self._subscribers: set[Feed] = set()

    def subscribe(self) -> Feed | None:
        """A queue of the events to come; None when the hub is full."""
        if len(self._subscribers) >= self.max_subscribers:
            return None
        queue: Feed = asyncio.Queue(maxsize=QUEUE_SIZE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: Feed) -> None:
        self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, event: dict[str, Any]) -> None:
        self.recent.append(event)
        try:
            self.on_event(event)
        except Exception:
            log.exception("event handler failed on %s", event.get("type"))
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                log.warning("dropping a websocket subscriber that does not keep up")
                self._drop(queue)

    def _drop(self, queue: Feed) -> None:
        self._subscribers.discard(queue)
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)  # tells its websocket to close

    async def run(self) -> None:
        while True:
            batch = await self.link.retry(
                STREAM, lambda: self.controller.wait_events(self.epoch, self.seq, POLL_S), self.clock
            )
            self.epoch, self.seq = batch["epoch"], batch["seq"]
            for event in batch["events"]:
                self.publish(event)
