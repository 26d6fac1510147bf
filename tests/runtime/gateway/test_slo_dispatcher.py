"""The ``slo`` dispatcher on a manual clock: registration bounds, the frame's server deadline, lazy
drop, re-mapping when a worker's server is gone, and a variant switch that drops nothing.

No Ray: the route mirror long-polls a fake controller (the real long-poll host), the agents are fakes
on the same virtual clock; the adaptation policy is the real ``jellyfish`` one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from failsoft.adaptation_data import upscaled_accuracy
from failsoft.clock import ManualClock
from failsoft.domain import App, Family, Variant
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    ModelNotLoadedError,
    ServerUnavailableError,
    UnknownNameError,
)
from failsoft.policies.adaptation.network import frame_kbit
from failsoft.runtime.gateway.dispatch import DispatchContext, Request, SloDispatcher
from failsoft.runtime.gateway.dispatch.slo import DISPATCH_WINDOW_S, IDLE_S, DispatchTimes
from failsoft.services import Service, ServiceMode, SloParams
from tests.asyncwait import until
from tests.runtime.gateway.fakes import FakeAgent, mirrored, route_entry, sync

ROW = np.zeros((1, 64), dtype=np.float32)
FAMILY = Family(
    "fam",
    (
        Variant("v0", 10.0, 0.80, 5.0, 1.0),
        Variant("v1", 20.0, 0.85, 5.0, 2.0),
        Variant("v2", 40.0, 0.90, 5.0, 3.0),
    ),
)
LOAD_S = 1.0


class SwitchingAgent(FakeAgent):
    """A fake agent that also loads (taking ``LOAD_S`` on the clock) and unloads."""

    def __init__(self, server: str, clock: ManualClock) -> None:
        super().__init__(server, clock, latency_s=0.002)
        self.loads: list[tuple[str, str, bool]] = []
        self.unloads: list[tuple[str, str]] = []
        self.missing: set[tuple[str, str]] = set()  # (app, variant) answered ModelNotLoadedError

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        if (app, variant) in self.missing:
            self.calls.append({"app": app, "variant": variant, "request_id": request_id})
            raise ModelNotLoadedError(f"server {self.server!r} does not hold {variant!r} for {app!r}")
        return await super().infer(app, variant, batch, timeout_s, request_id)

    async def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        self.loads.append((app, variant, background))
        await self.clock.sleep(LOAD_S)
        return {}

    async def unload(self, app: str, variant: str) -> bool:
        self.unloads.append((app, variant))
        return True


@dataclass
class Rig:
    clock: ManualClock
    agents: dict[str, SwitchingAgent]
    dispatcher: SloDispatcher

    def send(self, client: str, rid: str = "r1", **params: Any) -> asyncio.Task[Any]:
        request = Request("pool", ROW, self.clock.now() + 2.0, rid, {"client": client, **params})
        return asyncio.ensure_future(self.dispatcher.dispatch(request))

    async def finish(self, task: asyncio.Task[Any], most_s: float = 5.0) -> Any:
        """Run the virtual clock in small steps (plans run in a real thread) until ``task`` ends."""
        for _ in range(int(most_s / 0.001)):
            if task.done():
                return task.result()
            await asyncio.sleep(0.0005)
            await self.clock.run_for(0.001)
        raise AssertionError("the request did not end")


@contextlib.asynccontextmanager
async def rigged(params: SloParams | None = None) -> AsyncIterator[Rig]:
    clock = ManualClock(1000.0)
    agents = {s: SwitchingAgent(s, clock) for s in ("s1", "s2")}

    def agent(server: str) -> SwitchingAgent:
        if server not in agents:
            raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
        return agents[server]

    routes = {"w1": route_entry("s1", "v0"), "w2": route_entry("s2", "v0")}
    async with mirrored(clock, routes) as (controller, mirror):
        controller.agents = agents
        apps = {w: App(w, "fam") for w in ("w1", "w2")}
        context = DispatchContext(
            mirror,
            agent,
            clock,
            apps=apps,
            families={"fam": FAMILY},
            copies=controller,  # type: ignore[arg-type]
        )
        service = Service("pool", ServiceMode.SLO, ("w1", "w2"), params or SloParams())
        yield Rig(clock, agents, SloDispatcher(service, context))


def rigged_test(fn: Any) -> Any:
    async def run() -> None:
        async with rigged() as rig:
            await fn(rig)

    run.__name__ = fn.__name__
    return sync(run)


@rigged_test
async def test_bad_registrations_are_refused_naming_the_value(rig):
    d = rig.dispatcher
    with pytest.raises(ConfigError, match=r"slo_ms 1\.5 is below what the fastest variant 'v0' needs"):
        await d.register(1.5, 10)
    with pytest.raises(ConfigError, match=r"frame rate must be in .*got 0"):
        await d.register(100, 0)
    with pytest.raises(ConfigError, match=r"bandwidth_kbps must be in .*got -1"):
        await d.register(100, 10, bandwidth_kbps=-1)
    with pytest.raises(ConfigError, match="slo_ms must be a number; got 'fast'"):
        await d.register("fast", 10)
    assert d.clients == {}
    with pytest.raises(UnknownNameError, match="'ghost' is not registered"):
        d.report_bandwidth("ghost", 100)


@rigged_test
async def test_a_frame_gets_the_server_deadline_of_eq_1_and_the_answer_says_how_it_was_served(rig):
    reg = await rig.dispatcher.register(200, 10, bandwidth_kbps=50_000, rtt_ms=1)
    client = reg["client"]
    assert reg["worker"] in ("w1", "w2")
    answer = await rig.finish(rig.send(client, frame_px=224))
    call = next(c for a in rig.agents.values() for c in a.calls)
    # SLO - transfer of a 224 px frame at 50 Mbit/s - RTT - the answer's way back (the overhead's
    # starting 1 ms of dispatch; the way there is spent before the worker checks the deadline)
    expected_ms = 200 - frame_kbit(224) / 50_000 * 1000 - 1 - 1
    assert call["timeout_s"] * 1000 == pytest.approx(expected_ms, abs=0.01)
    params = answer.parameters()
    assert not answer.dropped and answer.outputs.shape == (1, 10)
    assert params["client"] == client and params["worker"] == reg["worker"]
    assert params["next_frame_px"] in (224, 380, 600) and params["residence_ms"] >= 2.0


@rigged_test
async def test_a_frame_the_queue_cannot_serve_in_time_is_answered_dropped_and_withdrawn(rig):
    client = (await rig.dispatcher.register(200, 10))["client"]
    for agent in rig.agents.values():
        agent.error = DeadlineExceededError("dropped: cannot finish before its deadline")
    answer = await rig.finish(rig.send(client))
    assert answer.dropped and answer.outputs is None
    assert answer.parameters()["drop_reason"] == "deadline"
    assert [c for a in rig.agents.values() for c in a.cancelled] == ["r1#1"]


@rigged_test
async def test_a_dead_workers_clients_are_remapped_at_once_and_the_frame_is_served_there(rig):
    d = rig.dispatcher
    ids = [(await d.register(200, 10))["client"] for _ in range(2)]
    victim = d.plan.worker_of(ids[0]).worker
    dead, alive = ("s1", "s2") if victim == "w1" else ("s2", "s1")
    rig.agents[dead].error = ServerUnavailableError(f"server {dead!r}: actor died")
    answer = await rig.finish(rig.send(ids[0]))
    assert (answer.server, answer.dropped, answer.attempts) == (alive, False, 2)
    assert all(d.plan.worker_of(c).worker != victim for c in ids)  # both on the live worker now
    assert victim not in [w.worker for w in d.plan.workers]


@rigged_test
async def test_a_variant_switch_loads_in_the_background_and_drops_no_frame(rig):
    d = rig.dispatcher
    client = (await d.register(200, 10, bandwidth_kbps=50_000))["client"]
    worker = d.plan.worker_of(client).worker
    server = "s1" if worker == "w1" else "s2"
    assert d.ladder.rungs[d.plan.worker_of(client).rung].name == "v2"  # room for the most accurate
    await until(lambda: rig.agents[server].loads, "the core is asked, and the background load starts")
    assert rig.dispatcher.context.copies.pins == [(worker, "v2", server, "slo:pool")]  # type: ignore[attr-defined]
    assert rig.agents[server].loads[:1] == [(worker, "v2", True)]
    during = await rig.finish(rig.send(client, "r1"))  # the load is still running
    assert (during.variant, during.dropped) == ("v0", False)
    await rig.clock.run_for(LOAD_S)
    await until(lambda: d.switches == 1, "the switch to v2 lands")
    after = await rig.finish(rig.send(client, "r2"))
    assert (after.variant, after.dropped) == ("v2", False)
    assert (rig.agents[server].calls[-1]["app"], rig.agents[server].calls[-1]["variant"]) == (worker, "v2")
    assert rig.agents[server].unloads == []  # the route's v0 stays with the controller
    assert d.switches == 1 and d.describe()["switches"] == 1
    await d.close()  # the rung is given back to the core
    assert d.context.copies.unpins == [(worker, server, "slo:pool")]  # type: ignore[attr-defined]


@rigged_test
async def test_a_client_silent_for_the_idle_time_has_left_and_one_that_reports_stays(rig):
    d = rig.dispatcher
    quiet = (await d.register(200, 10))["client"]
    talking = (await d.register(200, 10))["client"]
    rig.clock.advance(IDLE_S - 1)
    d.report_bandwidth(talking, 30_000)
    rig.clock.advance(2)
    await d.replan_now()
    assert set(d.clients) == {talking} and d.plan.worker_of(talking) is not None
    with pytest.raises(UnknownNameError, match="is not registered"):
        await d.dispatch(Request("pool", ROW, rig.clock.now() + 1, "r", {"client": quiet}))


@rigged_test
async def test_a_frame_whose_switched_variant_was_unloaded_is_retried_on_the_route_variant(rig):
    d = rig.dispatcher
    client = (await d.register(200, 10, bandwidth_kbps=50_000))["client"]
    worker = d.plan.worker_of(client).worker
    agent = rig.agents["s1" if worker == "w1" else "s2"]
    await until(lambda: agent.loads, "the background load starts")
    await rig.clock.run_for(LOAD_S)  # switched to the pinned v2 copy
    await until(lambda: d.switches == 1, "the switch to v2 lands")
    agent.missing.add((worker, "v2"))  # unloaded behind the dispatcher's back (a restarted agent)
    answer = await rig.finish(rig.send(client))
    assert (answer.variant, answer.dropped, answer.attempts) == ("v0", False, 2)
    assert [(c["app"], c["variant"]) for c in agent.calls[-2:]] == [(worker, "v2"), (worker, "v0")]


@rigged_test
async def test_a_frame_smaller_than_its_variants_input_counts_the_smaller_variants_accuracy(rig):
    d = rig.dispatcher
    client = (await d.register(200, 10, bandwidth_kbps=50_000))["client"]
    await until(lambda: any(a.loads for a in rig.agents.values()), "the background load starts")
    await rig.clock.run_for(LOAD_S)  # switched to v2 (input 600 px)
    await until(lambda: d.switches == 1, "the switch to v2 lands")
    full = await rig.finish(rig.send(client, "r1", frame_px=600))
    small = await rig.finish(rig.send(client, "r2", frame_px=224))  # v0's input size
    assert (full.variant, small.variant) == ("v2", "v2")
    assert (full.accuracy, small.accuracy) == (0.90, 0.80)
    assert not full.degraded and small.degraded


def test_an_edf_baseline_serves_every_client_on_its_fixed_variant_from_the_least_busy_worker():
    async def run() -> None:
        async with rigged(SloParams(policy="edf-small")) as rig:
            d = rig.dispatcher
            ids = [(await d.register(200, 10, bandwidth_kbps=50_000))["client"] for _ in range(3)]
            assert d.plan.pooled and {d.ladder.rungs[wp.rung].name for wp in d.plan.workers} == {"v0"}
            assert d.describe()["policy"] == "edf-small"
            # no per-worker mapping: two frames in flight at once go to the two workers
            first, second = rig.send(ids[0], "r1"), rig.send(ids[1], "r2")
            answers = [await rig.finish(first), await rig.finish(second)]
            assert sorted(a.server for a in answers) == ["s1", "s2"]
            assert all(a.variant == "v0" and not a.dropped for a in answers)
            assert not any(a.loads for a in rig.agents.values())  # the route's variant: no switch
            # the client's frame size follows throughput only (section 7.3): v0's input
            assert answers[0].parameters()["next_frame_px"] == 224

    sync(run)()


@rigged_test
async def test_one_stalled_call_does_not_inflate_the_overhead_and_old_times_expire(rig):
    d = rig.dispatcher
    client = (await d.register(200, 10, bandwidth_kbps=50_000))["client"]
    start_ms = d.overhead.total_ms
    for i in range(30):
        await rig.finish(rig.send(client, f"r{i}"))
    for agent in rig.agents.values():
        agent.latency_s = 0.150  # one stall of the shared machine, far longer than a dispatch
    await rig.finish(rig.send(client, "stalled"))
    for agent in rig.agents.values():
        agent.latency_s = 0.002
    # the median of the recent dispatch times and their spread: a few ms, not the EWMA's ~40 ms
    # that drops every frame
    assert d.overhead.total_ms < start_ms + 5
    for agent in rig.agents.values():
        agent.latency_s = 0.150  # a long stall: every recent call is slow
    for i in range(5):
        await rig.finish(rig.send(client, f"s{i}"))
    inflated = d.overhead.total_ms
    assert inflated > start_ms + 50
    rig.clock.advance(DISPATCH_WINDOW_S + 1)  # no call served since: the old times are forgotten
    await d.replan_now()
    assert d.overhead.total_ms == start_ms


@rigged_test
async def test_a_client_whose_uplink_cannot_carry_224_px_gets_smaller_frames_at_declared_accuracy(rig):
    d = rig.dispatcher
    # 1.5 Mbit/s carries 7 frames/s of 224 px, fewer than the client's 10: only the upscaled feeds fit
    reg = await d.register(300, 10, bandwidth_kbps=1_500)
    assert reg["worker"] is not None and reg["variant"] == "v0"  # mapped, not left unserved
    assert reg["frame_px"] < 224 and reg["frame_sizes_px"][:4] == [128, 160, 192, 224]
    answer = await rig.finish(rig.send(reg["client"], frame_px=reg["frame_px"]))
    assert not answer.dropped and answer.variant == "v0"
    assert answer.accuracy == pytest.approx(upscaled_accuracy(0.80, reg["frame_px"]))
    assert answer.accuracy < 0.80 and answer.degraded


def test_the_overheads_noise_follows_the_spread_of_recent_dispatch_times():
    times = DispatchTimes(1.0, 2.0, window_s=5.0)
    assert (times.dispatch_ms(0.0), times.noise_ms(0.0)) == (1.0, 2.0)  # nothing seen: the defaults
    for i in range(20):
        times.observe(i * 0.01, 3.0)
    assert (times.dispatch_ms(0.2), times.noise_ms(0.2)) == (3.0, 2.0)  # steady: the floor
    for i in range(20):
        times.observe(0.2 + i * 0.01, 3.0 + 8.0 * (i % 2))  # every other call 8 ms later
    assert times.dispatch_ms(0.4) == 3.0 and times.noise_ms(0.4) == pytest.approx(16.0)
    assert times.noise_ms(10.0) == 2.0  # all forgotten
