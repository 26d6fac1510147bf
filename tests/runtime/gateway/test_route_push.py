"""The routing table's two paths to the gateway: pushed (ZeroMQ PUB/SUB, the fast one) and
long-polled (the reliable one), and the mirror's rule that whichever comes first wins and the
other changes nothing.

Real ZeroMQ sockets on 127.0.0.1 between a :class:`RoutePublisher` (the controller's end) and the
mirror's subscriber; no Ray: the long-poll's other end is a stand-in controller that answers the
first table, naming the push endpoint, and then never again (as a long-poll stuck behind a busy
Ray), so what reaches the mirror after that came by push.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from failsoft.clock import MonotonicClock
from failsoft.runtime.gateway.routes import LONG_POLL, PUSH, RouteMirror
from failsoft.runtime.routepush import RoutePublisher
from tests.runtime.gateway.fakes import route_entry, sync

EPOCH = "e1"
WAIT_S = 5.0


def table(version: int, server: str, epoch: str = EPOCH, push: str | None = None) -> dict[str, Any]:
    snap = {"epoch": epoch, "version": version, "ready": True, "value": {"cam": route_entry(server)}}
    return {**snap, "fences": {}, "push": push}


class StuckController:
    """Answers the long-poll's first call with ``first``; every later call waits forever."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.first: dict[str, Any] | None = first

    async def wait_routes(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        if self.first is not None:
            first, self.first = self.first, None
            return first
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def pushed_until(publisher: RoutePublisher, snap: dict[str, Any], done: Any) -> None:
    """Push ``snap`` every 10 ms until ``done()`` (a PUB socket drops what it sends before the
    subscriber has joined; every push after the first is a duplicate, which must change nothing)."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"version {snap['version']} never came by push"
        publisher.send(snap)
        await asyncio.sleep(0.01)


@sync
async def test_a_pushed_table_reaches_the_mirror_while_the_long_poll_does_not_answer() -> None:
    publisher = RoutePublisher("127.0.0.1")
    assert publisher.endpoint is not None
    mirror = RouteMirror(StuckController(table(1, "s1", push=publisher.endpoint)), MonotonicClock())  # type: ignore[arg-type]
    poll = asyncio.ensure_future(mirror.run())
    try:
        await pushed_until(publisher, table(2, "s2", push=publisher.endpoint), lambda: mirror.version == 2)
        assert mirror.route("cam").server == "s2"  # type: ignore[union-attr]
        assert mirror.taken == {LONG_POLL: 1, PUSH: 1}  # the duplicates were not taken
    finally:
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        publisher.close()


def test_an_older_table_never_replaces_a_newer_one_whichever_path_brings_it() -> None:
    mirror = RouteMirror(StuckController(table(1, "s1")), MonotonicClock())  # type: ignore[arg-type]
    assert mirror.offer(table(3, "s3"), LONG_POLL)
    assert not mirror.offer(table(2, "s2"), PUSH)  # overtaken on the way
    assert not mirror.offer(table(3, "s3"), LONG_POLL)  # the same table, by the other path
    assert mirror.offer(table(4, "s4"), PUSH)
    assert not mirror.offer(table(4, "s4"), LONG_POLL)
    assert (mirror.version, mirror.route("cam").server) == (4, "s4")  # type: ignore[union-attr]


def test_a_new_epoch_is_taken_from_the_long_poll_only() -> None:
    """A restarted controller starts a new epoch at any version; a table still queued from the
    controller that died is of the old epoch and must not undo its successor's."""
    mirror = RouteMirror(StuckController(table(1, "s1")), MonotonicClock())  # type: ignore[arg-type]
    assert mirror.offer(table(9, "s1"), LONG_POLL)
    assert not mirror.offer(table(2, "s2", epoch="e2"), PUSH)
    assert mirror.offer(table(2, "s2", epoch="e2"), LONG_POLL)
    assert not mirror.offer(table(10, "s3"), PUSH)  # the dead controller's last push
    assert (mirror.epoch, mirror.version, mirror.route("cam").server) == ("e2", 2, "s2")  # type: ignore[union-attr]


def test_a_table_without_a_value_is_never_taken() -> None:
    mirror = RouteMirror(StuckController(table(1, "s1")), MonotonicClock())  # type: ignore[arg-type]
    assert not mirror.offer({"epoch": "e2", "version": 0, "value": None, "ready": False}, LONG_POLL)
    assert mirror.version == -1


def test_a_publisher_without_subscribers_drops_its_tables_without_blocking() -> None:
    publisher = RoutePublisher("127.0.0.1")
    try:
        started = time.monotonic()
        for version in range(1000):
            publisher.send(table(version, "s1"))
        assert time.monotonic() - started < WAIT_S
    finally:
        publisher.close()
