"""The ``single`` dispatcher on a manual clock: deadlines, moves to a newer route, cancellation.

No Ray: the route mirror long-polls a fake controller that serves the real long-poll host, and the
agents are fakes that answer (or hang, or fail) on the same virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from failsoft.clock import ManualClock
from failsoft.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotLoadedError,
    NoRouteError,
    OverloadedError,
    ServerUnavailableError,
    ServingError,
)
from failsoft.runtime.gateway.dispatch import DispatchContext, Request, SingleDispatcher
from failsoft.services import Service
from tests.runtime.gateway.fakes import FakeAgent, FakeController, mirrored, route_entry, sync

BATCH = np.zeros((2, 64), dtype=np.float32)
DEADLINE_S = 2.0


@dataclass
class Rig:
    clock: ManualClock
    controller: FakeController
    agents: dict[str, FakeAgent]
    dispatcher: SingleDispatcher
    outcomes: list[tuple[str, bool, str]]  # what app-level health was told

    def send(self, request_id: str = "r1") -> asyncio.Task:
        request = Request("cam", BATCH, self.clock.now() + DEADLINE_S, request_id)
        return asyncio.ensure_future(self.dispatcher.dispatch(request))


def with_rig(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """The test runs with a fresh rig: routes mirrored from a fake controller, agents s1 and s2."""

    async def run(**kwargs: Any) -> None:
        async with rigged() as rig:
            await fn(rig, **kwargs)

    run.__signature__ = inspect.Signature(list(inspect.signature(fn).parameters.values())[1:])
    run.__name__ = fn.__name__
    return sync(run)


@contextlib.asynccontextmanager
async def rigged() -> AsyncIterator[Rig]:
    clock = ManualClock(1000.0)
    agents = {name: FakeAgent(name, clock) for name in ("s1", "s2")}

    def agent(server: str) -> FakeAgent:
        if server not in agents:
            raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
        return agents[server]

    outcomes: list[tuple[str, bool, str]] = []

    def outcome(server: str, ok: bool, error: str) -> None:
        outcomes.append((server, ok, error))

    async with mirrored(clock, {"cam": route_entry("s1", "big")}) as (controller, mirror):
        context = DispatchContext(mirror, agent, clock, outcome)  # type: ignore[arg-type]
        yield Rig(clock, controller, agents, SingleDispatcher(Service.single("cam"), context), outcomes)


@with_rig
async def test_a_request_is_answered_on_its_route_and_the_answer_says_how(rig):
    rig.controller.set_route(
        "cam", route_entry("s2", "small", "warm", degraded=True, accuracy=0.8, detected_at=5.0)
    )
    await rig.clock.run_for(0)
    task = rig.send()
    await rig.clock.run_for(0.01)
    answer = task.result()
    assert (answer.server, answer.variant, answer.kind, answer.degraded, answer.accuracy) == (
        "s2",
        "small",
        "warm",
        True,
        0.8,
    )
    assert (answer.attempts, answer.reconstructed, answer.dropped, answer.detected_at) == (
        1,
        False,
        False,
        5.0,
    )
    assert answer.outputs.shape == (2, 10)
    (call,) = rig.agents["s2"].calls
    assert call["request_id"] == "r1#1" and call["timeout_s"] == pytest.approx(DEADLINE_S)
    assert answer.parameters()["reconstructed"] is False and "dropped" in answer.parameters()


@with_rig
async def test_a_hung_server_gets_504_at_the_deadline_and_the_call_is_withdrawn(rig):
    rig.agents["s1"].latency_s = None
    task = rig.send()
    await rig.clock.run_for(DEADLINE_S - 0.01)
    assert not task.done()  # nothing gives up before the deadline
    await rig.clock.run_for(0.01)
    with pytest.raises(DeadlineExceededError, match="'s1' did not answer"):
        task.result()
    assert rig.agents["s1"].cancelled == ["r1#1"]


@with_rig
async def test_a_route_change_moves_a_waiting_request_to_the_new_route(rig):
    rig.agents["s1"].latency_s = None  # hung: the controller fails it over to s2
    task = rig.send()
    await rig.clock.run_for(0.5)
    rig.controller.set_route("cam", route_entry("s2", "small", "warm"))
    await rig.clock.run_for(0.01)
    answer = task.result()
    assert (answer.server, answer.attempts) == ("s2", 2)
    assert rig.agents["s1"].cancelled == ["r1#1"]  # the call left behind is withdrawn
    assert [c["request_id"] for c in rig.agents["s2"].calls] == ["r1#2"]  # one id per call
    assert rig.agents["s2"].calls[0]["timeout_s"] == pytest.approx(DEADLINE_S - 0.5)


@with_rig
async def test_no_route_is_a_503_exactly_at_the_deadline(rig):
    rig.controller.set_route("cam", None)
    await rig.clock.run_for(0)
    task = rig.send()
    await rig.clock.run_for(DEADLINE_S - 0.01)
    assert not task.done()
    await rig.clock.run_for(0.01)
    with pytest.raises(NoRouteError, match="no live server"):
        task.result()


@with_rig
async def test_a_route_that_appears_before_the_deadline_answers(rig):
    rig.controller.set_route("cam", None)
    await rig.clock.run_for(0)
    task = rig.send()
    await rig.clock.run_for(1.5)
    rig.controller.set_route("cam", route_entry("s2", "small", "progressive"))
    await rig.clock.run_for(0.01)
    assert task.result().server == "s2" and task.result().attempts == 1


@pytest.mark.parametrize(
    "error",
    [ServerUnavailableError("server 's1': unavailable (RayActorError)"), ModelNotLoadedError("not held")],
)
@with_rig
async def test_a_server_gone_or_without_the_model_waits_for_the_next_route(rig, error):
    rig.agents["s1"].error = error
    task = rig.send()
    await rig.clock.run_for(1.0)
    assert not task.done()  # waiting for the controller's new route, not failing
    rig.controller.set_route("cam", route_entry("s2", "small", "progressive"))
    await rig.clock.run_for(0.01)
    assert (task.result().server, task.result().attempts) == ("s2", 2)


@with_rig
async def test_a_server_gone_with_no_new_route_in_time_is_a_503(rig):
    rig.agents["s1"].error = ServerUnavailableError("gone")
    task = rig.send()
    await rig.clock.run_for(DEADLINE_S)
    with pytest.raises(NoRouteError, match="'s1' failed and no new route came in time"):
        task.result()


@with_rig
async def test_a_server_with_no_agent_right_now_waits_for_the_next_route(rig):
    rig.controller.set_route("cam", route_entry("s9", "big"))  # its agent is being replaced
    await rig.clock.run_for(0)
    task = rig.send()
    await rig.clock.run_for(0.3)
    rig.controller.set_route("cam", route_entry("s1", "big"))
    await rig.clock.run_for(0.01)
    assert task.result().server == "s1"


@with_rig
async def test_a_refused_request_passes_through_with_its_retry_after(rig):
    rig.agents["s1"].error = OverloadedError("queue full", retry_after_s=2.5)
    task = rig.send()
    await rig.clock.run_for(0)
    with pytest.raises(OverloadedError) as err:
        task.result()
    assert err.value.retry_after_s == 2.5
    assert len(rig.agents["s1"].calls) == 1  # no retry on the same route


@with_rig
async def test_a_client_that_leaves_withdraws_its_call(rig):
    rig.agents["s1"].latency_s = 1.0
    task = rig.send("gone")
    await rig.clock.run_for(0.2)
    task.cancel()
    await rig.clock.run_for(0)
    assert task.cancelled()
    assert rig.agents["s1"].cancelled == ["gone#1"]


@with_rig
async def test_an_answer_in_time_is_not_withdrawn(rig):
    task = rig.send()
    await rig.clock.run_for(0.5)
    assert task.result().attempts == 1
    assert rig.agents["s1"].cancelled == []


@pytest.mark.parametrize(
    ("error", "counted"),
    [
        (None, [("s1", True)]),  # answered
        (ServingError("CUDA error: device-side assert"), [("s1", False)]),  # the server's own failure
        (OverloadedError("queue full", retry_after_s=1.0), []),  # back-pressure: not sickness
        (InvalidRequestError("bad input"), []),  # the client's mistake
    ],
)
@with_rig
async def test_app_level_health_hears_the_servers_own_failures_only(rig, error, counted):
    rig.agents["s1"].error = error
    task = rig.send()
    await rig.clock.run_for(0.02)
    assert task.done()
    assert [(server, ok) for server, ok, _ in rig.outcomes] == counted


@with_rig
async def test_app_level_health_hears_a_timeout_but_not_a_move(rig):
    rig.agents["s1"].latency_s = None  # hung
    task = rig.send()
    await rig.clock.run_for(DEADLINE_S)
    with pytest.raises(DeadlineExceededError):
        task.result()
    assert [(s, ok) for s, ok, _ in rig.outcomes] == [("s1", False)]
    assert "deadline" in rig.outcomes[0][2]
    rig.outcomes.clear()
    moved = rig.send("r2")  # still hung, but the route moves away: the failover's doing, not health's
    await rig.clock.run_for(0.1)
    rig.controller.set_route("cam", route_entry("s2", "small", "warm"))
    await rig.clock.run_for(0.1)
    assert moved.result().server == "s2"
    assert rig.outcomes == [("s2", True, "")]


@contextlib.asynccontextmanager
async def reporting(reload_s: float | None) -> AsyncIterator[Rig]:
    """The rig with the controller told of lost models (``copies``), reloading them in place as
    the core does when ``reload_s`` is set (tests/orchestration/test_model_lost.py tests the core)."""
    async with rigged() as rig:
        rig.controller.agents, rig.controller.reload_s = rig.agents, reload_s
        context = DispatchContext(
            rig.dispatcher.context.routes, rig.agents.__getitem__, rig.clock, copies=rig.controller
        )  # type: ignore[arg-type]
        rig.dispatcher = SingleDispatcher(Service.single("cam"), context)
        yield rig


@sync
async def test_a_model_lost_on_a_live_server_is_reported_once_and_its_requests_retry_on_the_reload():
    """s1 lives on but lost cam's model: the calls that find it gone tell the controller once
    (however many find it at once), the core unroutes the app while it reloads it in place (0.3 s
    here) and routes it again as a new route, and every request waiting meanwhile is answered there,
    none at its deadline; the requests that came while it was unrouted wait for the route too."""
    async with reporting(reload_s=0.3) as rig:
        rig.agents["s1"].error = ModelNotLoadedError("server 's1' does not hold 'big' for 'cam'")
        found = [rig.send(f"r{i}") for i in range(3)]
        await rig.clock.run_for(0.05)
        assert rig.controller.lost_reports == [("cam", "s1", "big")]  # three findings, one report
        assert rig.dispatcher.context.routes.route("cam") is None and not rig.dispatcher.ready()
        later = rig.send("r3")  # while it reloads: waits for the route, not sent to s1
        await rig.clock.run_for(0.5)
        answers = [t.result() for t in (*found, later)]
        assert [(a.server, a.variant) for a in answers] == [("s1", "big")] * 4
        assert [a.attempts for a in answers] == [2, 2, 2, 1]
        assert rig.controller.lost_reports == [("cam", "s1", "big")]
        assert len(rig.agents["s1"].calls) == 3 + 4  # the three refused, then the four answered


@sync
async def test_a_model_lost_with_a_warm_backup_is_answered_there_once_the_core_switches():
    async with reporting(reload_s=None) as rig:
        rig.agents["s1"].error = ModelNotLoadedError("not held")
        task = rig.send()
        await rig.clock.run_for(0.05)
        assert rig.controller.lost_reports == [("cam", "s1", "big")] and not task.done()
        rig.controller.set_route("cam", route_entry("s2", "small", "warm"))  # the core's warm switch
        await rig.clock.run_for(0.05)
        assert (task.result().server, task.result().kind, task.result().attempts) == ("s2", "warm", 2)


@sync
async def test_without_the_report_a_model_lost_on_a_live_server_fails_its_request_at_the_deadline():
    async with rigged() as rig:  # no controller to tell (NoCopies): the route never changes
        rig.agents["s1"].error = ModelNotLoadedError("not held")
        task = rig.send()
        await rig.clock.run_for(DEADLINE_S)
        with pytest.raises(NoRouteError):
            task.result()
