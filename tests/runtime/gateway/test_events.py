"""The event hub: fan-out of the controller's events, a cap on subscribers, slow ones dropped."""

from __future__ import annotations

import asyncio

from failsoft.clock import ManualClock
from failsoft.runtime.gateway.events import QUEUE_SIZE, EventHub
from tests.runtime.gateway.fakes import FakeController, sync


@sync
async def test_every_subscriber_gets_each_event_once_and_the_metrics_see_it():
    clock = ManualClock()
    controller = FakeController(clock)
    seen: list[str] = []
    hub = EventHub(controller, lambda e: seen.append(e["type"]), clock)  # type: ignore[arg-type]
    feeds = [hub.subscribe(), hub.subscribe()]
    poll = asyncio.ensure_future(hub.run())
    await clock.run_for(0)
    controller.log.append({"type": "failure", "app": "cam"})
    controller.log.append({"type": "failover", "app": "cam"})
    await clock.run_for(0)
    for feed in feeds:
        assert [feed.get_nowait()["type"] for _ in range(2)] == ["failure", "failover"] and feed.empty()
    assert seen == ["failure", "failover"] and [e["seq"] for e in hub.recent] == [1, 2]
    poll.cancel()


def test_subscribers_are_capped_and_a_slow_one_is_dropped_with_a_close_signal():
    hub = EventHub(None, lambda e: None, ManualClock(), max_subscribers=2)  # type: ignore[arg-type]
    slow, fast = hub.subscribe(), hub.subscribe()
    assert slow is not None and fast is not None and hub.subscribe() is None
    for n in range(QUEUE_SIZE):
        hub.publish({"type": "failure", "n": n})
        fast.get_nowait()
    hub.publish({"type": "failure", "n": QUEUE_SIZE})  # slow's queue is full: it is dropped
    assert hub.subscribers == 1 and slow.get_nowait() is None and slow.empty()
    assert fast.get_nowait()["n"] == QUEUE_SIZE
    assert hub.subscribe() is not None  # its place is free again
