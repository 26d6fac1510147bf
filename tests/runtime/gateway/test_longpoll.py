"""Pushed, versioned state on a manual clock: the long-poll host, the gateway's route mirror, and
how the gateway reports losing its controller (once per outage)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from failsoft.clock import ManualClock
from failsoft.runtime.longpoll import EventLog, VersionedValue
from tests.runtime.gateway.fakes import FakeController, mirrored, route_entry, sync


@sync
async def test_a_reader_of_an_older_version_is_answered_at_once():
    clock = ManualClock()
    value = VersionedValue({"a": 1}, clock=clock)
    value.publish({"a": 2})
    snap = await value.wait_newer(value.epoch, 0, 10.0)
    assert (snap["version"], snap["value"]) == (1, {"a": 2}) and clock.now() == 0.0


@sync
async def test_a_reader_of_another_epoch_is_answered_at_once_whatever_the_numbers():
    value = VersionedValue("x", version=3, clock=ManualClock())
    snap = await value.wait_newer("an-older-controller", 99, 10.0)
    assert (snap["epoch"], snap["version"]) == (value.epoch, 3)


@sync
async def test_a_current_reader_waits_for_the_next_publish_and_every_waiter_wakes():
    clock = ManualClock()
    value = VersionedValue("old", clock=clock)
    readers = [asyncio.ensure_future(value.wait_newer(value.epoch, 0, 10.0)) for _ in range(3)]
    await clock.run_for(5.0)
    assert not any(r.done() for r in readers)
    value.publish("new")
    await clock.run_for(0)
    assert [r.result()["value"] for r in readers] == ["new"] * 3
    assert clock.now() == 5.0  # woken by the publish, not by a timeout
    # stamped when published on the publisher's clock, however late a reader reads it
    await clock.run_for(2.0)
    assert value.snapshot()["published_at"] == 5.0 and readers[0].result()["published_at"] == 5.0


@sync
async def test_a_current_reader_gets_the_same_version_back_at_its_timeout():
    clock = ManualClock()
    value = VersionedValue("v", clock=clock)
    reader = asyncio.ensure_future(value.wait_newer(value.epoch, 0, 10.0))
    await clock.run_for(9.99)
    assert not reader.done()
    await clock.run_for(0.01)
    assert reader.result()["version"] == 0


@sync
async def test_the_event_log_returns_what_came_after_and_everything_retained_on_a_new_epoch():
    clock = ManualClock()
    log = EventLog(capacity=3, clock=clock)
    for n in range(5):
        log.append({"n": n})
    after = await log.wait_after(log.epoch, 3, 1.0)
    assert [e["n"] for e in after["events"]] == [3, 4] and after["seq"] == 5
    fresh = await log.wait_after("previous-controller", 5, 1.0)
    assert [e["seq"] for e in fresh["events"]] == [3, 4, 5]  # the last 3 kept


@sync
async def test_an_event_reader_waits_for_the_next_event_or_its_timeout():
    clock = ManualClock()
    log = EventLog(clock=clock)
    reader = asyncio.ensure_future(log.wait_after(log.epoch, 0, 10.0))
    await clock.run_for(1.0)
    assert not reader.done()
    log.append({"type": "failure"})
    await clock.run_for(0)
    assert [e["type"] for e in reader.result()["events"]] == ["failure"]
    idle = asyncio.ensure_future(log.wait_after(log.epoch, 1, 10.0))
    await clock.run_for(10.0)
    assert idle.result()["events"] == []


@sync
async def test_the_mirror_follows_every_publish_at_once():
    clock = ManualClock()
    async with mirrored(clock, {"cam": route_entry("s1")}) as (controller, mirror):
        assert mirror.route("cam").server == "s1" and mirror.ready
        changed = asyncio.ensure_future(mirror.wait_route_change("cam", mirror.route("cam"), 5.0))
        controller.set_route("cam", route_entry("s2", "small", "warm"))
        await clock.run_for(0)
        assert changed.result() is True and mirror.route("cam").server == "s2"
        assert mirror.version == controller.table.version
        same = asyncio.ensure_future(mirror.wait_route_change("cam", mirror.route("cam"), 5.0))
        controller.set_route("other", route_entry("s1"))  # another app's change does not count
        await clock.run_for(4.99)
        assert not same.done()
        await clock.run_for(0.01)
        assert same.result() is False


@sync
async def test_the_mirror_picks_up_a_restarted_controllers_table():
    clock = ManualClock()
    async with mirrored(clock, {"cam": route_entry("s1")}) as (controller, mirror):
        for _ in range(5):
            controller.set_route("cam", route_entry("s1"))
        await clock.run_for(0)
        restarted = FakeController(clock, {"cam": route_entry("s3")})  # new epoch, version 0
        mirror.controller = restarted
        await clock.run_for(10.0)  # the parked poll times out, the next one meets the new epoch
        assert mirror.epoch == restarted.table.epoch and mirror.route("cam").server == "s3"


@sync
async def test_a_restarted_controller_still_resuming_leaves_the_mirror_serving_its_table():
    """A restarted controller whose resume waits (its store does not answer) answers "nothing new"
    at each long-poll's timeout: the mirror keeps its table and stays ready, however long it takes."""
    clock = ManualClock()
    async with mirrored(clock, {"cam": route_entry("s1")}) as (controller, mirror):
        restarted = FakeController(clock, {"cam": {"route": None}})  # its table before resuming
        restarted.resumed.clear()
        mirror.controller = restarted
        controller.set_route("cam", route_entry("s1"))  # wakes the parked poll: the next is the new one's
        await clock.run_for(35.0)  # three long-polls time out meanwhile
        assert restarted.calls >= 3
        assert mirror.epoch == controller.table.epoch  # the dead controller's table, still mirrored
        assert mirror.ready and mirror.route("cam").server == "s1"
        restarted.set_route("cam", route_entry("s1"))  # resumed: the stored route, kept
        restarted.resumed.set()
        await clock.run_for(0.0)
        assert (mirror.epoch, mirror.ready, mirror.route("cam").server) == (restarted.table.epoch, True, "s1")


@sync
async def test_losing_the_controller_is_one_warning_per_outage_and_the_last_table_keeps_serving(caplog):
    caplog.set_level(logging.DEBUG, logger="failsoft.runtime.gateway")
    clock = ManualClock()
    async with mirrored(clock, {"cam": route_entry("s1")}) as (controller, mirror):
        for _ in range(2):
            controller.down = True
            controller.set_route("cam", route_entry("s1"))  # wakes the parked poll; the next call fails
            calls = controller.calls
            await clock.run_for(5.0)
            assert not mirror.link.connected
            assert mirror.route("cam").server == "s1"  # serving with the last table
            assert controller.calls - calls < 15  # backed off (20 ms doubling to 1 s), not spinning
            controller.set_route("cam", route_entry("s2"))  # decided while the gateway could not hear
            controller.down = False
            await clock.run_for(1.5)  # the next retry, at most 1 s later
            assert mirror.link.connected and mirror.route("cam").server == "s2"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2 and all("does not answer" in r.getMessage() for r in warnings)
        assert len([r for r in caplog.records if "answers again" in r.getMessage()]) == 2


def test_one_warning_when_several_streams_fail_in_one_outage(caplog):
    from failsoft.errors import ServerUnavailableError
    from failsoft.runtime.gateway.link import ControllerLink

    caplog.set_level(logging.DEBUG, logger="failsoft.runtime.gateway.link")
    link = ControllerLink()
    link.ok("route long-poll")
    for stream in ("route long-poll", "event long-poll", "stats poll", "route long-poll"):
        link.failed(stream, ServerUnavailableError("gone"))
    link.ok("route long-poll")
    assert not link.connected  # two streams still fail
    link.ok("event long-poll")
    link.ok("stats poll")
    assert link.connected
    levels = [r.levelno for r in caplog.records]
    assert levels.count(logging.WARNING) == 1 and levels.count(logging.INFO) == 1


pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # no coroutine left un-awaited
