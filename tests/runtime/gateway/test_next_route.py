"""The next route before the controller's, on a manual clock: when the gateway's connection to a
server ends, the calls on it move at once to the app's most accurate loaded warm backup on a live
server, and later requests skip the dead server, until the controller's table speaks.

No Ray: the route mirror long-polls a fake controller over the real long-poll host, and the agents
are fakes on the same virtual clock; a fake agent's :meth:`Dying.die` fails the calls waiting on it
and tells the mirror, as a real connection's end does (the data-plane client fails its waiting
calls, then the gateway's listener marks the server lost), which a live cluster produces only by
killing a process (tests/runtime/dataplane/test_crash_signal.py does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from failsoft.clock import ManualClock
from failsoft.errors import ServerUnavailableError
from failsoft.runtime.gateway.dispatch import (
    DispatchContext,
    GraphDispatcher,
    Move,
    Request,
    SingleDispatcher,
)
from failsoft.runtime.gateway.routes import LOST_HOLD_S, RouteMirror
from failsoft.services import GraphNode, GraphParams, Service, ServiceMode
from tests.asyncwait import until
from tests.runtime.gateway.fakes import FakeAgent, FakeController, mirrored, route_entry, sync

BATCH = np.zeros((1, 64), dtype=np.float32)
DEADLINE_S = 2.0
T0 = 1000.0


class Dying(FakeAgent):
    """A fake agent whose process can die: :meth:`die` fails its waiting calls, and every later
    call, with the data-plane client's error."""

    def __init__(self, server: str, clock: ManualClock) -> None:
        super().__init__(server, clock)
        self.gone = asyncio.Event()

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        answer = asyncio.ensure_future(super().infer(app, variant, batch, timeout_s, request_id))
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if answer.done():
            return answer.result()
        answer.cancel()
        raise ServerUnavailableError(f"server {self.server!r}: connection lost (the agent closed it)")


def warm(server: str, variant: str, accuracy: float) -> dict[str, Any]:
    return {"server": server, "variant": variant, "degraded": accuracy < 0.9, "accuracy": accuracy}


# cam is served on s1 (big, 0.9); its warm backups: s2 (small, 0.8) and s3 (mid, 0.85)
BACKUPS = [warm("s2", "small", 0.8), warm("s3", "mid", 0.85)]


@dataclass
class Rig:
    clock: ManualClock
    controller: FakeController
    mirror: RouteMirror
    agents: dict[str, Dying]
    dispatcher: SingleDispatcher
    moves: list[Move]

    def send(self, request_id: str) -> asyncio.Task[Any]:
        request = Request("cam", BATCH, self.clock.now() + DEADLINE_S, request_id)
        return asyncio.ensure_future(self.dispatcher.dispatch(request))

    def die(self, server: str) -> None:
        """``server``'s process dies: its connection ends, as the gateway sees it."""
        self.agents[server].gone.set()
        self.mirror.connection_lost(server)

    def publish(self, route: dict[str, Any] | None, backups: list[dict[str, Any]], failed: str = "") -> None:
        """A new table from the controller (``failed``: a server it declared failed in it)."""
        if failed:
            self.controller.fences[failed] = self.clock.now()
        entry = {"route": None} if route is None else route
        self.controller.table.publish({"cam": {**entry, "warm": backups}})

    def calls(self, server: str) -> list[str | None]:
        return [c["request_id"] for c in self.agents[server].calls]


@contextlib.asynccontextmanager
async def rigged(shortcut: bool = True) -> AsyncIterator[Rig]:
    clock = ManualClock(T0)
    agents = {name: Dying(name, clock) for name in ("s1", "s2", "s3")}
    moves: list[Move] = []
    table = {"cam": {**route_entry("s1", "big"), "warm": BACKUPS}}
    async with mirrored(clock, table) as (controller, mirror):
        for server in agents:
            mirror.connection_made(server)  # as the gateway does at start
        context = DispatchContext(mirror, agents.__getitem__, clock, moved=moves.append)  # type: ignore[arg-type]
        dispatcher = SingleDispatcher(Service.single("cam"), context, shortcut=shortcut)
        yield Rig(clock, controller, mirror, agents, dispatcher, moves)


def rig_test(fn: Any) -> Any:
    async def run() -> None:
        async with rigged() as rig:
            await fn(rig)

    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return sync(run)


@rig_test
async def test_calls_in_flight_move_to_the_most_accurate_warm_backup_when_the_connection_ends(rig):
    rig.agents["s1"].latency_s = 1.0  # a long batch: the requests are in flight when s1 dies
    tasks = [rig.send(f"r{i}") for i in range(3)]
    await rig.clock.run_for(0.2)
    version = rig.mirror.version
    rig.die("s1")
    await until(lambda: len(rig.calls("s3")) == 3, "the three calls sent on to s3")
    assert rig.clock.now() == T0 + 0.2  # at the connection's end: no time passed on the clock
    await rig.clock.run_for(0.01)
    answers = [t.result() for t in tasks]
    assert {(a.server, a.variant, a.kind, a.attempts) for a in answers} == {("s3", "mid", "backup", 2)}
    assert all(a.degraded and a.accuracy == 0.85 and a.detected_at is None for a in answers)
    assert rig.mirror.version == version and rig.controller.table.version == version  # no new table
    assert rig.calls("s2") == []
    assert sorted(m.request_id for m in rig.moves) == ["r0", "r1", "r2"]
    for m in rig.moves:
        assert (m.left, m.to, m.via) == ("s1", "s3", "backup")
        assert m.started_at == T0 and m.lost_at == m.failed_at == m.sent_at == T0 + 0.2
        assert m.answered_at == pytest.approx(T0 + 0.21) and m.route_at is m.route_seen_at is None


@rig_test
async def test_a_request_that_comes_after_the_end_is_not_sent_to_the_dead_server(rig):
    rig.die("s1")
    await rig.clock.run_for(0.05)
    task = rig.send("late")
    await rig.clock.run_for(0.01)
    assert (task.result().server, task.result().attempts) == ("s3", 1)
    assert rig.calls("s1") == []
    (move,) = rig.moves
    assert (move.left, move.via, move.failed_at, move.lost_at) == ("s1", "backup", None, T0)
    assert move.started_at == move.sent_at == T0 + 0.05


@rig_test
async def test_the_controllers_route_wins_once_it_comes_and_a_backup_call_under_way_goes_on(rig):
    rig.agents["s1"].latency_s = 1.0
    rig.agents["s3"].latency_s = 0.5
    early = rig.send("early")
    await rig.clock.run_for(0.1)
    rig.die("s1")
    await until(lambda: rig.calls("s3") == ["early#2"], "the call moved to s3")
    await rig.clock.run_for(0.1)
    # the controller chose s2 (its choice, not the gateway's), and declared s1 failed
    rig.publish(route_entry("s2", "small", "warm", accuracy=0.8), [warm("s3", "mid", 0.85)], "s1")
    await rig.clock.run_for(0)
    assert not rig.mirror.lost("s1")  # the controller has spoken: its table says where to go
    late = rig.send("late")
    await rig.clock.run_for(0.01)
    assert (late.result().server, late.result().kind) == ("s2", "warm")
    await rig.clock.run_for(0.4)  # s3 answers 0.5 s after the call it got at the death
    assert (early.result().server, early.result().kind) == ("s3", "backup")
    assert rig.agents["s3"].cancelled == []  # not abandoned when the controller's route came


@rig_test
async def test_a_backup_on_a_lost_server_is_never_chosen(rig):
    rig.die("s3")
    rig.die("s1")
    task = rig.send("r")
    await rig.clock.run_for(0.01)
    assert task.result().server == "s2"
    assert rig.calls("s3") == [] and rig.calls("s1") == []


@rig_test
async def test_with_every_backup_lost_the_request_waits_for_the_controllers_route(rig):
    for server in ("s1", "s2", "s3"):
        rig.die(server)
    rig.agents["s4"] = Dying("s4", rig.clock)
    task = rig.send("r")
    await rig.clock.run_for(0.5)
    assert not task.done() and not any(rig.calls(s) for s in ("s1", "s2", "s3"))
    rig.publish(route_entry("s4", "big", "progressive"), [], "s1")
    await rig.clock.run_for(0.01)
    assert (task.result().server, task.result().kind) == ("s4", "progressive")
    (move,) = rig.moves
    assert (move.via, move.route_seen_at) == ("route", T0 + 0.5)


@rig_test
async def test_a_backup_declared_failed_during_the_call_is_left_for_the_next_one(rig):
    rig.agents["s3"].latency_s = None  # hung: the controller will declare it failed
    rig.die("s1")
    task = rig.send("r")
    await until(lambda: rig.calls("s3") == ["r#1"], "the call on s3")
    await rig.clock.run_for(0.3)
    rig.publish(route_entry("s1", "big"), BACKUPS, "s3")  # s3 failed; s1's death not yet heard
    await rig.clock.run_for(0.01)
    assert rig.agents["s3"].cancelled == ["r#1"]  # withdrawn
    assert (task.result().server, task.result().attempts) == ("s2", 2)


@rig_test
async def test_a_lost_server_is_tried_again_after_the_hold_without_the_controllers_word(rig):
    rig.die("s1")
    assert rig.mirror.lost("s1")
    await rig.clock.run_for(LOST_HOLD_S + 0.01)
    assert not rig.mirror.lost("s1")
    rig.agents["s1"] = Dying("s1", rig.clock)  # a restarted agent answers there
    task = rig.send("r")
    await rig.clock.run_for(0.01)
    assert task.result().server == "s1"


@rig_test
async def test_a_new_connection_ends_the_mark(rig):
    rig.die("s1")
    rig.mirror.connection_made("s1")
    assert not rig.mirror.lost("s1")


@rig_test
async def test_a_failure_the_controller_declared_before_the_end_was_seen_ends_the_mark_at_once(rig):
    """The sidecar's death notice can reach the controller, and its table the gateway, before the
    gateway sees the connection end: the mark is then stale from the start."""
    rig.publish(route_entry("s3", "mid", "warm", accuracy=0.85), [warm("s2", "small", 0.8)], "s1")
    await rig.clock.run_for(0)
    rig.die("s1")
    assert not rig.mirror.lost("s1")


def test_without_the_shortcut_an_in_flight_call_waits_for_the_controllers_route():
    """A coded service's members (ParM decodes meanwhile) keep the controller's word only."""

    async def body() -> None:
        async with rigged(shortcut=False) as rig:
            rig.agents["s1"].latency_s = 1.0
            task = rig.send("r")
            await rig.clock.run_for(0.1)
            rig.die("s1")
            await rig.clock.run_for(0.3)
            assert not task.done() and rig.calls("s3") == [] and rig.calls("s2") == []
            rig.publish(route_entry("s2", "small", "warm", accuracy=0.8, route_at=7.0), [], "s1")
            await rig.clock.run_for(0.01)
            assert (task.result().server, task.result().kind) == ("s2", "warm")
            (move,) = rig.moves
            assert (move.via, move.failed_at, move.route_seen_at, move.route_at) == (
                "route", T0 + 0.1, T0 + 0.4, 7.0,
            )  # fmt: skip

    sync(body)()


def test_a_stateful_graph_node_is_not_moved_by_the_gateway():
    """HAMS promotes a stateful node's backup in the core; a stateless node fails over as a
    ``single`` app does."""
    nodes = (GraphNode("a", "app-a"), GraphNode("c", "app-c", stateful=True))
    params = GraphParams(nodes, (("a", "c"),))
    service = Service("dag", ServiceMode.GRAPH, ("app-a", "app-c"), params)
    clock = ManualClock(T0)
    context = DispatchContext(RouteMirror(FakeController(clock), clock), FakeAgent, clock)  # type: ignore[arg-type]
    calls = GraphDispatcher(service, context)._calls
    assert (calls["a"].shortcut, calls["c"].shortcut) == (True, False)


def test_a_connection_made_before_the_first_table_takes_that_tables_failure_stamp():
    """A gateway started after a server's earlier failure connects before its first table: that
    old stamp is not a new failure, and the server's death is still the gateway's to act on."""
    clock = ManualClock(T0)
    mirror = RouteMirror(FakeController(clock), clock)  # type: ignore[arg-type]
    mirror.connection_made("s1")
    mirror.update({"epoch": "e", "version": 1, "value": {}, "fences": {"s1": 999.5}})
    mirror.connection_lost("s1")
    assert mirror.lost("s1") and mirror.lost_at("s1") == T0
