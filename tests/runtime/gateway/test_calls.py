"""``call_on_route``, the one call primitive every dispatcher uses, on a manual clock.

No Ray. The route mirror long-polls a fake controller serving the real long-poll host; the agent
is :class:`~tests.runtime.gateway.fakes.FakeAgent`, which stands for a Ray agent actor so that a
hang (never answers), a crash (ServerUnavailableError), an error while serving, a full queue, and a
route change in the middle of a call can each be produced on demand, on the same virtual clock.
Each test checks the three things the primitive owns: what it returns or raises, what it withdrew
from the agent's queue, and what app-level health heard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from failsoft.clock import ManualClock, MonotonicClock
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    DroppedError,
    FailsoftError,
    InvalidRequestError,
    ModelNotLoadedError,
    OverloadedError,
    ServerUnavailableError,
    ServingError,
)
from failsoft.runtime.gateway.dispatch import DispatchContext
from failsoft.runtime.gateway.dispatch.calls import CallResult, CallStatus, Target, Watch, call_on_route
from failsoft.runtime.gateway.dispatch.interface import LossReports
from failsoft.runtime.gateway.routes import RouteMirror
from tests.runtime.gateway.fakes import FakeAgent, FakeController, mirrored, route_entry, sync

BATCH = np.zeros((1, 64), dtype=np.float32)
DEADLINE_S = 1.0


@dataclass
class Rig:
    clock: ManualClock
    controller: FakeController
    mirror: RouteMirror
    agents: dict[str, FakeAgent]
    outcomes: list[tuple[str, bool, str]] = field(default_factory=list)
    losses: LossReports = field(default_factory=LossReports)  # one per gateway, shared by its calls

    @property
    def context(self) -> DispatchContext:
        def agent(server: str) -> FakeAgent:
            if server not in self.agents:
                raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
            return self.agents[server]

        def outcome(server: str, ok: bool, error: str) -> None:
            self.outcomes.append((server, ok, error))

        return DispatchContext(
            self.mirror, agent, self.clock, outcome, copies=self.controller, losses=self.losses
        )  # type: ignore[arg-type]

    def call(self, server: str = "s1", watch: Watch | str | None = "route") -> asyncio.Task[CallResult]:
        """A call to ``server``'s ``cam`` (variant big) with DEADLINE_S left, watching cam's route
        as it is now (``"route"``), or as given."""
        if watch == "route":
            watch = Watch.route_changes("cam", self.mirror.route("cam"))
        assert watch is None or isinstance(watch, Watch)
        target = Target(server, "cam", "big")
        deadline = self.clock.now() + DEADLINE_S
        return asyncio.ensure_future(call_on_route(self.context, target, BATCH, "r1#1", deadline, watch))


@contextlib.asynccontextmanager
async def rigged() -> AsyncIterator[Rig]:
    clock = ManualClock()
    async with mirrored(clock, {"cam": route_entry("s1", "big")}) as (controller, mirror):
        agents = {s: FakeAgent(s, clock) for s in ("s1", "s2")}
        yield Rig(clock, controller, mirror, agents)


@sync
async def test_an_answer_is_returned_and_heard_as_ok_and_nothing_is_withdrawn():
    async with rigged() as rig:
        task = rig.call()
        await rig.clock.run_for(0.01)
        result = task.result()
        assert result.status is CallStatus.ANSWERED and result.error is None
        assert result.outputs.shape == (1, 10)
        call = rig.agents["s1"].calls[0]
        assert (call["app"], call["variant"], call["request_id"]) == ("cam", "big", "r1#1")
        assert call["timeout_s"] == pytest.approx(DEADLINE_S)  # the time left, all of it
        assert rig.agents["s1"].cancelled == []
        assert rig.outcomes == [("s1", True, "")]


@sync
async def test_a_route_that_moves_mid_call_withdraws_it_and_says_moved_without_an_outcome():
    async with rigged() as rig:
        rig.agents["s1"].latency_s = None  # hung
        task = rig.call()
        await rig.clock.run_for(0.2)
        assert not task.done()
        rig.controller.set_route("cam", route_entry("s2", "small", "warm"))
        await rig.clock.run_for(0.01)
        result = task.result()
        assert result.status is CallStatus.MOVED
        assert rig.clock.now() < DEADLINE_S  # at the move, not at the deadline
        assert rig.agents["s1"].cancelled == ["r1#1"]
        assert rig.outcomes == []  # the failover's doing, not the server's health


@sync
async def test_no_answer_by_the_deadline_on_an_unmoved_route_is_withdrawn_and_heard_as_not_ok():
    async with rigged() as rig:
        rig.agents["s1"].latency_s = None  # hung
        task = rig.call()
        await rig.clock.run_for(DEADLINE_S - 0.01)
        assert not task.done()
        await rig.clock.run_for(0.01)
        result = task.result()
        assert result.status is CallStatus.DEADLINE
        assert isinstance(result.error, DeadlineExceededError) and "s1" in str(result.error)
        assert rig.agents["s1"].cancelled == ["r1#1"]
        assert [(s, ok) for s, ok, _ in rig.outcomes] == [("s1", False)]
        assert "deadline" in rig.outcomes[0][2]


@sync
async def test_a_caller_cancelled_because_its_client_left_withdraws_the_call_and_is_cancelled():
    async with rigged() as rig:
        rig.agents["s1"].latency_s = 0.5
        task = rig.call()
        await rig.clock.run_for(0.1)
        task.cancel()
        await rig.clock.run_for(0)
        assert task.cancelled()
        with pytest.raises(asyncio.CancelledError):
            task.result()
        assert rig.agents["s1"].cancelled == ["r1#1"]
        assert rig.outcomes == []


@pytest.mark.parametrize(
    "error",
    [OverloadedError("queue full", retry_after_s=2.5), DroppedError("dropped: it cannot make its deadline")],
)
@sync
async def test_a_queue_that_refuses_or_drops_the_work_is_no_outcome(error: FailsoftError):
    async with rigged() as rig:
        rig.agents["s1"].error = error
        task = rig.call()
        await rig.clock.run_for(0.01)
        result = task.result()
        assert result.status is CallStatus.REFUSED and result.error is error
        with pytest.raises(type(error)):
            result.raise_error()
        assert rig.outcomes == [] and rig.agents["s1"].cancelled == []  # the queue holds nothing


@pytest.mark.parametrize(
    "error",
    [
        ServerUnavailableError("server 's1': actor died"),  # crashed under the call
        ModelNotLoadedError("server 's1' does not hold 'big' for 'cam'"),  # unloaded under it
    ],
)
@sync
async def test_a_dead_server_or_an_unloaded_model_moves_the_call_without_an_outcome(error: FailsoftError):
    async with rigged() as rig:
        rig.agents["s1"].error = error
        task = rig.call()
        await rig.clock.run_for(0.01)
        result = task.result()
        assert (result.status, result.error) == (CallStatus.MOVED, error)
        assert rig.outcomes == []


@sync
async def test_a_server_with_no_agent_at_the_moment_moves_the_call_before_anything_is_sent():
    async with rigged() as rig:
        task = rig.call("s9")
        await rig.clock.run_for(0)
        assert task.result().status is CallStatus.MOVED
        assert rig.outcomes == [] and all(not a.calls for a in rig.agents.values())


@sync
async def test_the_transports_own_timeout_is_no_answer_by_the_deadline():
    async with rigged() as rig:
        rig.agents["s1"].error = DeadlineExceededError("agent-s1.infer: no answer within 1000 ms")
        task = rig.call()
        await rig.clock.run_for(0.01)
        result = task.result()
        assert result.status is CallStatus.DEADLINE and result.error is rig.agents["s1"].error
        assert rig.agents["s1"].cancelled == ["r1#1"]  # the queue may still hold it
        assert [(s, ok) for s, ok, _ in rig.outcomes] == [("s1", False)]


@sync
async def test_an_error_while_serving_is_raised_and_heard_bad_input_only_raised():
    async with rigged() as rig:
        rig.agents["s1"].error = ServingError("CUDA error: device-side assert")
        task = rig.call()
        await rig.clock.run_for(0.01)
        with pytest.raises(ServingError, match="CUDA"):
            task.result()
        assert [(s, ok) for s, ok, _ in rig.outcomes] == [("s1", False)]
        rig.outcomes.clear()
        for bad in (InvalidRequestError("bad input"), ConfigError("expects a batch of shape (N, 64)")):
            rig.agents["s1"].error = bad
            task = rig.call()
            await rig.clock.run_for(0.01)
            with pytest.raises(type(bad)):
                task.result()
        assert rig.outcomes == []  # the client's mistake, not the server's


@sync
async def test_a_leaves_server_watch_holds_while_the_route_stays_on_the_server():
    async with rigged() as rig:
        rig.agents["s1"].latency_s = 0.5
        task = rig.call(watch=Watch.leaves_server("cam", "s1"))
        await rig.clock.run_for(0.1)
        rig.controller.set_route("cam", route_entry("s1", "small", "warm"))  # re-routed on s1
        await rig.clock.run_for(0.1)
        rig.controller.set_route("cam", None)  # unrouted for a while
        await rig.clock.run_for(0.4)
        assert task.result().status is CallStatus.ANSWERED
        rig.agents["s1"].latency_s = None
        moved = rig.call(watch=Watch.leaves_server("cam", "s1"))
        await rig.clock.run_for(0.1)
        rig.controller.set_route("cam", route_entry("s2", "big"))
        await rig.clock.run_for(0.01)
        assert moved.result().status is CallStatus.MOVED
        assert rig.agents["s1"].cancelled == ["r1#1"]


@sync
async def test_a_call_with_no_route_to_watch_still_ends_at_the_deadline_on_the_clock():
    async with rigged() as rig:
        rig.agents["s1"].latency_s = None  # a dispatcher's own copy (a promoted backup), hung
        task = rig.call(watch=None)
        rig.controller.set_route("cam", route_entry("s2", "big"))  # not watched: no move
        await rig.clock.run_for(DEADLINE_S)
        assert task.result().status is CallStatus.DEADLINE
        assert rig.agents["s1"].cancelled == ["r1#1"]
        assert [(s, ok) for s, ok, _ in rig.outcomes] == [("s1", False)]


@sync
async def test_an_answer_from_a_server_declared_failed_during_the_call_is_fenced_off():
    """The watch of a pinned copy stays put when its server fails (leaves_server, no new route), so
    only the fence keeps its late answer (a healed partition delivering it) from the client."""
    async with rigged() as rig:
        rig.agents["s1"].latency_s = 0.5
        task = rig.call(watch=Watch.leaves_server("cam", "s1"))
        await rig.clock.run_for(0.2)
        rig.controller.declare_failed("s1")
        await rig.clock.run_for(0.01)
        assert rig.mirror.fence("s1") is not None and not task.done()  # learned; the call runs on
        await rig.clock.run_for(0.3)
        result = task.result()
        assert result.status is CallStatus.MOVED and "fenced off" in str(result.error)
        assert result.outputs is None and rig.outcomes == []


@sync
async def test_a_call_sent_after_the_gateway_learned_of_a_failure_is_answered():
    """The fence compares stamps from the call's start to its end: a server restored after its
    failure (the stamp unchanged since) answers as before."""
    async with rigged() as rig:
        rig.controller.declare_failed("s1")
        await rig.clock.run_for(0.01)
        task = rig.call(watch=Watch.leaves_server("cam", "s1"))
        await rig.clock.run_for(0.01)
        assert task.result().status is CallStatus.ANSWERED


@contextlib.asynccontextmanager
async def rigged_live() -> AsyncIterator[Rig]:
    """The rig on the runtime's clock (``time.monotonic``, the event loop's own): the path where a
    call races its answer, the mirror's next update and its deadline with no task of its own."""
    clock = MonotonicClock()
    controller = FakeController(clock, {"cam": route_entry("s1", "big")})  # type: ignore[arg-type]
    mirror = RouteMirror(controller, clock)  # type: ignore[arg-type]
    poll = asyncio.ensure_future(mirror.run())
    try:
        while mirror.route("cam") is None:
            await asyncio.sleep(0.001)
        agents = {s: FakeAgent(s, clock) for s in ("s1", "s2")}  # type: ignore[arg-type]
        yield Rig(clock, controller, mirror, agents)  # type: ignore[arg-type]
    finally:
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)


@sync
async def test_on_the_runtime_clock_a_call_ends_at_a_move_or_its_deadline_without_a_watcher_task():
    async with rigged_live() as rig:
        rig.agents["s1"].latency_s = None  # hung
        before = len(asyncio.all_tasks())
        task = rig.call()
        await asyncio.sleep(0.05)
        assert len(asyncio.all_tasks()) == before + 2  # the caller's and the agent call's; no watcher
        rig.controller.set_route("cam", route_entry("s2", "small", "warm"))
        result = await asyncio.wait_for(task, DEADLINE_S / 2)  # at the move, not at the deadline
        assert result.status is CallStatus.MOVED and rig.agents["s1"].cancelled == ["r1#1"]
        assert rig.outcomes == []
        rig.agents["s2"].latency_s = None
        started = rig.clock.now()
        result = await rig.call("s2", watch=None)  # hung too, nothing to watch: its deadline ends it
        assert result.status is CallStatus.DEADLINE and rig.clock.now() - started >= DEADLINE_S
        assert rig.agents["s2"].cancelled == ["r1#1"] and [s for s, _, _ in rig.outcomes] == ["s2"]


@sync
async def test_an_unloaded_model_is_told_to_the_controller_once_per_finding():
    """A live server that no longer holds the model (ModelNotLoadedError) is told to the controller
    (``report_model_lost``), whose core decides what follows; calls that find the same loss while
    the report is under way add no other; a dead server (ServerUnavailableError) is the failure
    detector's, not reported."""
    async with rigged() as rig:
        rig.agents["s1"].error = ModelNotLoadedError("server 's1' does not hold 'big' for 'cam'")
        calls = [rig.call() for _ in range(3)]
        await rig.clock.run_for(0.01)
        assert [c.result().status for c in calls] == [CallStatus.MOVED] * 3
        assert rig.controller.lost_reports == [("cam", "s1", "big")] and rig.losses.under_way == 0
        rig.agents["s2"].error = ServerUnavailableError("gone")
        await rig.call("s2", watch=None)
        assert rig.controller.lost_reports == [("cam", "s1", "big")] and rig.outcomes == []
