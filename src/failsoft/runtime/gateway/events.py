"""Client notification (FailLite 4: "asynchronously informs the applications' clients ... using websockets").

The controller appends events to its log; the gateway's :class:`EventHub` long-polls that log and
fans each event out to every ``/v2/events`` websocket subscriber. Event types:

* ``failure``: a server failed (one event per app it served: ``app``, ``server``, ``variant`` it
  served, ``accuracy``, ``detected_at``);
* ``failover``: the app is served again, at ``server`` on ``variant`` (``kind``: warm, progressive or
  cold; ``route_ms``: detection to route published, load time included);
* ``upgrade``: a progressive failover switched to its final variant;
* ``restore``: the app is back on its primary;
* also ``unrecovered``, ``server_up`` and ``ready``.

A subscriber too slow to keep up (its queue full) is dropped rather than slowing the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from failsoft.runtime.cluster import ControllerRef

log = logging.getLogger(__name__)
QUEUE_SIZE = 1000


class EventHub:
    def __init__(self, controller: ControllerRef, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.controller = controller
        self.on_event = on_event
        self.epoch = ""
        self.seq = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=QUEUE_SIZE)
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUE_SIZE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
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
                self._subscribers.discard(queue)

    async def run(self) -> None:
        backoff = 0.02
        while True:
            try:
                batch = await self.controller.wait_events(self.epoch, self.seq, 10.0)
                backoff = 0.02
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("event long-poll failed: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            self.epoch, self.seq = batch["epoch"], batch["seq"]
            for event in batch["events"]:
                self.publish(event)
