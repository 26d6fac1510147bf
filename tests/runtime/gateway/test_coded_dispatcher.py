"""The ``coded`` dispatcher (ParM) on a manual clock: groups, fill timeouts, decoding, cancellation.

No Ray: routes are mirrored from a fake controller and the agents are fakes whose "model" is a
linear map, so a parity model of it is the same map (F(X1 + X2) = F(X1) + F(X2)) and a decoded
output must equal the member's own output exactly.
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
from failsoft.errors import InvalidRequestError, OverloadedError, ServerUnavailableError
from failsoft.runtime.gateway.dispatch import CodedDispatcher, DispatchContext, Request, dispatcher_class
from failsoft.runtime.gateway.dispatch.coded import ERRED_HOLD_S
from failsoft.services import CodedParams, Service, ServiceMode
from tests.runtime.gateway.fakes import FakeAgent, mirrored, route_entry, sync

SHAPE = (64,)
WEIGHTS = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)
DEADLINE_S = 2.0


class LinearAgent(FakeAgent):
    """Answers ``batch @ WEIGHTS`` after its latency: a linear model, its own parity model."""

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        await super().infer(app, variant, batch, timeout_s, request_id)
        return np.asarray(batch, dtype=np.float32) @ WEIGHTS


@dataclass
class Rig:
    clock: ManualClock
    controller: Any
    agents: dict[str, LinearAgent]
    dispatcher: CodedDispatcher
    events: list[dict[str, Any]]
    sent: int = 0

    def send(self, value: float, shape: tuple[int, ...] = (1, *SHAPE)) -> tuple[asyncio.Task, np.ndarray]:
        self.sent += 1
        batch = np.random.default_rng(self.sent).normal(size=shape).astype(np.float32) * value
        request = Request("digits", batch, self.clock.now() + DEADLINE_S, f"r{self.sent}")
        return asyncio.ensure_future(self.dispatcher.dispatch(request)), batch

    def calls(self, server: str) -> list[str]:
        return [c["request_id"] for c in self.agents[server].calls]


@contextlib.asynccontextmanager
async def rigged(r: int = 1, fill_timeout_ms: float = 10.0) -> AsyncIterator[Rig]:
    clock = ManualClock(1000.0)
    members = ("d0", "d1", *(f"p{p}" for p in range(r)))
    servers = {m: f"s-{m}" for m in members}
    agents = {s: LinearAgent(s, clock) for s in servers.values()}

    def agent(server: str) -> LinearAgent:
        if server not in agents:
            raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
        return agents[server]

    events: list[dict[str, Any]] = []
    routes = {m: route_entry(s, "mlp" if m.startswith("d") else f"parity{m}") for m, s in servers.items()}
    async with mirrored(clock, routes) as (controller, mirror):
        context = DispatchContext(
            mirror,
            agent,
            clock,
            input_shape=lambda app: SHAPE,
            event=events.append,  # type: ignore[arg-type]
        )
        service = Service(
            "digits", ServiceMode.CODED, members, CodedParams(k=2, r=r, fill_timeout_ms=fill_timeout_ms)
        )
        yield Rig(clock, controller, agents, CodedDispatcher(service, context), events)


def test_the_coded_mode_has_a_dispatcher():
    service = Service("digits", ServiceMode.CODED, ("d0", "d1", "p0"), CodedParams())
    assert dispatcher_class(service) is CodedDispatcher


@sync
async def test_a_full_group_is_answered_by_its_members_and_its_parity_call_is_withdrawn():
    async with rigged() as rig:
        rig.agents["s-p0"].latency_s = 0.05  # the parity is slower than both data members
        (t1, _x1), (t2, x2) = rig.send(1.0), rig.send(2.0)
        await rig.clock.run_for(0)
        assert rig.calls("s-d0") == ["r1#d#1"] and rig.calls("s-d1") == ["r2#d#1"]
        assert rig.calls("s-p0") == ["r1#p0#1"]  # sent once the group was full
        await rig.clock.run_for(0.02)
        a1, a2 = t1.result(), t2.result()
        assert not a1.reconstructed and not a2.reconstructed
        np.testing.assert_allclose(a2.outputs, x2 @ WEIGHTS, rtol=1e-5)
        assert rig.agents["s-p0"].cancelled == ["r1#p0#1"]  # no longer needed: withdrawn
        assert rig.dispatcher.counts["coded_groups"] == 1 and not rig.dispatcher._groups


@sync
async def test_a_slow_member_is_decoded_from_the_parity_and_cancelled():
    async with rigged() as rig:
        rig.agents["s-d1"].latency_s = 1.0  # a straggler
        (t1, _x1), (t2, x2) = rig.send(1.0), rig.send(1.5)
        await rig.clock.run_for(0.011)
        answer = t2.result()  # long before the straggler's 1 s
        assert answer.reconstructed and answer.parameters()["reconstructed"] is True
        assert answer.kind == "reconstructed" and answer.server == "s-p0"
        np.testing.assert_allclose(answer.outputs, x2 @ WEIGHTS, rtol=1e-4, atol=1e-4)
        assert not t1.result().reconstructed
        assert rig.agents["s-d1"].cancelled == ["r2#d#1"]  # the straggler's work is withdrawn
        assert rig.dispatcher.counts["reconstructed"] == 1
        assert rig.dispatcher.counts["reconstructed_during_failover"] == 0  # slow, not failed
        assert not rig.events


@sync
async def test_a_lone_request_is_never_held_and_its_group_goes_uncoded_at_the_fill_timeout():
    async with rigged(fill_timeout_ms=10.0) as rig:
        rig.agents["s-d0"].latency_s = 0.002
        t1, _ = rig.send(1.0)
        await rig.clock.run_for(0.003)
        assert t1.done() and not t1.result().reconstructed  # answered before the timeout
        assert rig.dispatcher.former.waiting == 1
        await rig.clock.run_for(0.008)  # 11 ms after it joined: released uncoded
        assert rig.dispatcher.former.waiting == 0 and rig.dispatcher.counts["uncoded_groups"] == 1
        t2, _ = rig.send(1.0)  # a new group: data member 0 again, still no parity
        await rig.clock.run_for(0.02)
        assert rig.calls("s-d0") == ["r1#d#1", "r2#d#1"] and rig.calls("s-p0") == []
        assert not t2.result().reconstructed and not rig.dispatcher._groups


@sync
async def test_a_request_of_the_wrong_shape_is_refused_and_the_group_is_unaffected():
    async with rigged() as rig:
        _t1, _ = rig.send(1.0)
        bad, _ = rig.send(1.0, shape=(1, 32))
        await rig.clock.run_for(0)
        with pytest.raises(InvalidRequestError, match=r"shape \[N, 64\]; got \[1, 32\]"):
            bad.result()
        assert rig.dispatcher.former.waiting == 1  # the open group still waits for its 2nd query
        rig.agents["s-d1"].latency_s = 1.0
        t3, x3 = rig.send(3.0)
        await rig.clock.run_for(0.02)
        assert rig.calls("s-d1") == ["r3#d#1"] and rig.calls("s-p0") == ["r1#p0#1"]
        assert t3.result().reconstructed
        np.testing.assert_allclose(t3.result().outputs, x3 @ WEIGHTS, rtol=1e-4, atol=1e-4)


@sync
async def test_r2_decodes_both_data_members_from_the_two_parities():
    async with rigged(r=2) as rig:
        rig.agents["s-d0"].latency_s = None  # hung
        rig.agents["s-d1"].latency_s = None
        (t1, x1), (t2, x2) = rig.send(1.0), rig.send(-0.5)
        await rig.clock.run_for(0.02)
        assert rig.calls("s-p0") == ["r1#p0#1"] and rig.calls("s-p1") == ["r1#p1#1"]
        for task, x in ((t1, x1), (t2, x2)):
            assert task.result().reconstructed
            np.testing.assert_allclose(task.result().outputs, x @ WEIGHTS, rtol=1e-3, atol=1e-3)
        assert rig.agents["s-d0"].cancelled == ["r1#d#1"] and rig.agents["s-d1"].cancelled == ["r2#d#1"]


@sync
async def test_a_killed_member_is_reconstructed_from_the_kill_and_events_say_so():
    async with rigged() as rig:
        del rig.agents["s-d1"]  # killed: its agent is gone, the route not yet failed over
        (t1, _), (t2, x2) = rig.send(1.0), rig.send(1.0)
        (t3, _), (t4, x4) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        for task, x in ((t2, x2), (t4, x4)):
            assert task.result().reconstructed
            np.testing.assert_allclose(task.result().outputs, x @ WEIGHTS, rtol=1e-4, atol=1e-4)
        assert not t1.result().reconstructed and not t3.result().reconstructed
        assert rig.dispatcher.counts["reconstructed_during_failover"] == 2
        assert [e["type"] for e in rig.events] == ["coded_failover"] and rig.events[0]["app"] == "d1"
        # the controller fails d1 over to a new server; its next answer ends the episode
        rig.agents["s-new"] = LinearAgent("s-new", rig.clock)
        rig.controller.set_route("d1", route_entry("s-new", "mlp", "progressive"))
        await rig.clock.run_for(0)
        (_t5, _), (t6, _) = rig.send(1.0), rig.send(1.0)
        rig.agents["s-p0"].latency_s = 0.05
        await rig.clock.run_for(0.02)
        assert not t6.result().reconstructed and t6.result().server == "s-new"
        assert [e["type"] for e in rig.events] == ["coded_failover", "coded_recovered"]
        assert rig.events[1]["reconstructed"] == 2


@sync
async def test_a_member_whose_calls_hang_until_it_fails_over_is_an_episode_too_and_events_say_so():
    async with rigged() as rig:
        rig.agents["s-d1"].latency_s = None  # killed, but its calls hang instead of failing
        sent = [rig.send(1.0) for _ in range(4)]
        await rig.clock.run_for(0.02)
        assert all(t.result().reconstructed for t, _ in sent[1::2])  # d1's, decoded as stragglers
        assert rig.events == [] and rig.dispatcher.counts["reconstructed_during_failover"] == 0
        # a route that moves without a failure (an upgrade to a server that hangs too) is no failover
        rig.agents["s-d1b"] = LinearAgent("s-d1b", rig.clock, latency_s=None)
        rig.controller.set_route("d1", route_entry("s-d1b", "mlp", "primary"))
        await rig.clock.run_for(0.001)
        more = [rig.send(1.0) for _ in range(2)]
        await rig.clock.run_for(0.02)
        assert more[1][0].result().reconstructed and rig.events == []
        # the controller detects the failure and publishes d1's failover route: at the next request
        # the requests decoded since d1's last answer (3) are counted as its failover's
        rig.agents["s-new"] = LinearAgent("s-new", rig.clock)
        rig.controller.set_route("d1", route_entry("s-new", "mlp", "progressive", detected_at=1000.05))
        await rig.clock.run_for(0.001)
        (_t, _), (t8, _) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        assert [e["type"] for e in rig.events] == ["coded_failover", "coded_recovered"]
        assert rig.events[1]["reconstructed"] == 3 and rig.events[1]["app"] == "d1"
        assert rig.dispatcher.counts["reconstructed_during_failover"] == 3
        assert not t8.result().reconstructed and t8.result().server == "s-new"
        # it answers again: a later move with a new detection finds nothing decoded, no episode
        rig.agents["s-new2"] = LinearAgent("s-new2", rig.clock)
        rig.controller.set_route("d1", route_entry("s-new2", "mlp", "progressive", detected_at=1000.2))
        await rig.clock.run_for(0.001)
        rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        assert len(rig.events) == 2


@sync
async def test_stragglers_before_a_member_fails_belong_to_its_one_episode():
    async with rigged() as rig:
        rig.agents["s-d1"].latency_s = None  # hangs: d1's two queries are decoded as stragglers
        first = [rig.send(1.0) for _ in range(4)]
        await rig.clock.run_for(0.02)
        assert all(t.result().reconstructed for t, _ in first[1::2]) and rig.events == []
        del rig.agents["s-d1"]  # then its calls fail at once: d1 is failing, an ordinary episode
        second = [rig.send(1.0) for _ in range(4)]
        await rig.clock.run_for(0.02)
        assert all(t.result().reconstructed for t, _ in second[1::2])
        assert [e["type"] for e in rig.events] == ["coded_failover"]
        rig.agents["s-new"] = LinearAgent("s-new", rig.clock)
        rig.controller.set_route("d1", route_entry("s-new", "mlp", "progressive", detected_at=1000.05))
        await rig.clock.run_for(0.001)
        third = [rig.send(1.0) for _ in range(4)]
        await rig.clock.run_for(0.02)
        assert not any(t.result().reconstructed for t, _ in third)
        # one episode, counting the stragglers since d1's last answer and the decodes while failing
        assert [e["type"] for e in rig.events] == ["coded_failover", "coded_recovered"]
        assert rig.events[1]["reconstructed"] == 4 == rig.dispatcher.counts["reconstructed_during_failover"]


@sync
async def test_a_query_decoded_after_its_dead_members_route_moved_counts_for_that_failover():
    """The order a fast failover gives (seen in CI): the killed member's calls hang, the controller
    declares its server failed and moves its route *before* the parity answer decodes the query sent
    there, and the member answers on its new route before that decode. The query was still sent to
    a server that failed: it was reconstructed during the failover, and its one episode says so."""
    async with rigged() as rig:
        rig.agents["s-d1"].latency_s = None  # killed: its calls hang
        rig.agents["s-p0"].latency_s = 0.05  # the parity answers after the route has moved
        (t1, _), (t2, x2) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.001)
        rig.agents["s-new"] = LinearAgent("s-new", rig.clock, latency_s=0.2)  # still warming up
        rig.controller.fences["s-d1"] = rig.clock.now()  # declared failed, in the table that moves d1
        moved = route_entry("s-new", "mlp", "progressive", detected_at=rig.clock.now())
        rig.controller.set_route("d1", moved)
        await rig.clock.run_for(0.001)
        rig.agents["s-new"].latency_s = 0.005  # warm: later queries of d1 are answered there at once
        later = [rig.send(1.0) for _ in range(2)]  # the route change is seen before any decode
        await rig.clock.run_for(0.06)
        assert not t1.result().reconstructed and t2.result().reconstructed
        np.testing.assert_allclose(t2.result().outputs, x2 @ WEIGHTS, rtol=1e-4, atol=1e-4)
        assert rig.dispatcher.counts["reconstructed_during_failover"] == 1
        assert [e["type"] for e in rig.events] == ["coded_failover"]
        more = [rig.send(1.0) for _ in range(2)]  # d1 serves on its new route: the episode ends
        await rig.clock.run_for(0.3)
        assert all(t.done() for t, _ in later + more)
        assert [e["type"] for e in rig.events] == ["coded_failover", "coded_recovered"]
        assert rig.events[1]["reconstructed"] == 1 and rig.events[1]["app"] == "d1"


@sync
async def test_a_member_that_refuses_its_query_is_decoded_around_and_fails_it_only_when_nothing_can():
    """An overloaded member refuses at once (its queue's admission control): in a coded group the
    request is answered from the parity; in an uncoded one by the other data member; when nothing
    can answer it, it gets the member's own error at once (never hangs)."""
    async with rigged(fill_timeout_ms=10.0) as rig:
        refused = OverloadedError("s-d1/d1: overloaded, cannot finish before its deadline")
        rig.agents["s-d1"].error = refused
        (t1, _), (t2, x2) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        assert not t1.result().reconstructed and t2.result().reconstructed
        np.testing.assert_allclose(t2.result().outputs, x2 @ WEIGHTS, rtol=1e-4, atol=1e-4)
        # the parity fails as well: nothing can decode it, the other data member serves it
        rig.agents["s-p0"].error = OverloadedError("s-p0/p0: overloaded")
        await rig.clock.run_for(ERRED_HOLD_S)  # d1 is passed over a while after it refused
        (t3, _), (t4, _) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        assert not t3.result().reconstructed
        assert t4.result().server == "s-d0" and not t4.result().reconstructed
        # a lone query in a group that goes uncoded: served by the other data member (same model)
        rig.agents["s-p0"].error = None
        rig.agents["s-d0"].latency_s = 0.05  # d0 busy: the lone query goes to d1, which refuses
        rig.dispatcher._in_flight[0] += 5
        await rig.clock.run_for(ERRED_HOLD_S)
        lone, x = rig.send(1.0)
        await rig.clock.run_for(0.02)  # released uncoded at 10 ms, sent to d0 then
        assert not lone.done()
        await rig.clock.run_for(0.05)
        assert lone.result().server == "s-d0" and not lone.result().reconstructed
        np.testing.assert_allclose(lone.result().outputs, x @ WEIGHTS, rtol=1e-4, atol=1e-4)
        assert rig.dispatcher.counts["served_by_another_member"] == 2
        # ... and when that member refuses too, the first member's error, at once
        rig.agents["s-d0"].error = OverloadedError("s-d0/d0: overloaded")
        await rig.clock.run_for(ERRED_HOLD_S)
        last, _ = rig.send(1.0)
        await rig.clock.run_for(0.02)
        with pytest.raises(OverloadedError, match="s-d1/d1: overloaded"):
            last.result()
        rig.dispatcher._in_flight[0] -= 5
        await rig.clock.run_for(1.0)
        assert not rig.dispatcher._groups


@sync
async def test_two_queries_of_one_group_refused_by_one_member_are_served_by_the_other_and_it_is_passed_over():
    """Both queries of a group went to d1 (fewest in flight) before its first refusal came back: a
    parity decodes only one of them, so both are served by d0; d1 then gets no new query for a
    while (it would win every tie again, refusing at once)."""
    async with rigged() as rig:
        rig.agents["s-d1"].error = OverloadedError("s-d1/d1: overloaded")
        rig.dispatcher._in_flight[0] += 5  # d0 looks busy: both go to d1
        sent = [rig.send(1.0) for _ in range(2)]
        await rig.clock.run_for(0.02)
        assert rig.calls("s-d1") == ["r1#d#1", "r2#d#1"]
        for task, x in sent:
            assert task.result().server == "s-d0" and not task.result().reconstructed
            np.testing.assert_allclose(task.result().outputs, x @ WEIGHTS, rtol=1e-4, atol=1e-4)
        more = [rig.send(1.0) for _ in range(2)]  # within the hold: d1 is passed over
        await rig.clock.run_for(0.02)
        assert rig.calls("s-d1") == ["r1#d#1", "r2#d#1"]
        assert all(not t.result().reconstructed for t, _ in more)
        rig.dispatcher._in_flight[0] -= 5
        await rig.clock.run_for(1.0)
        assert not rig.dispatcher._groups


@sync
async def test_a_lone_query_of_a_killed_member_is_served_by_another_data_member_at_the_fill_timeout():
    async with rigged(fill_timeout_ms=10.0) as rig:
        del rig.agents["s-d0"]  # killed, not failed over yet
        lone, x = rig.send(1.0)  # slot 0 of a group that never fills: no parity can help it
        await rig.clock.run_for(0.009)
        assert not lone.done()
        await rig.clock.run_for(0.002 + 0.01)  # released uncoded at 10 ms, then served by d1
        answer = lone.result()
        assert not answer.reconstructed and answer.server == "s-d1"
        np.testing.assert_allclose(answer.outputs, x @ WEIGHTS, rtol=1e-5)
        assert rig.calls("s-d1") == ["r1#f#1"] and rig.dispatcher.counts["served_by_another_member"] == 1
        late, _ = rig.send(1.0)  # d0 already known failing: the next lone query falls back too
        await rig.clock.run_for(0.021)
        assert late.result().server == "s-d1"


@sync
async def test_a_query_goes_to_the_data_member_with_fewest_calls_in_flight_not_always_its_slot():
    async with rigged(fill_timeout_ms=100.0) as rig:
        rig.agents["s-d0"].latency_s = 1.0  # busy with a long call
        rig.agents["s-p0"].latency_s = 1.0  # and no parity answer to decode it from soon
        (t1, _), (t2, _) = rig.send(1.0), rig.send(1.0)
        await rig.clock.run_for(0.02)
        assert t2.done() and not t1.done()
        t3, x3 = rig.send(1.0)  # slot 0 of the next group: d0 has a call in flight, d1 none
        await rig.clock.run_for(0.02)
        assert rig.calls("s-d0") == ["r1#d#1"] and rig.calls("s-d1") == ["r2#d#1", "r3#d#1"]
        answer = t3.result()
        assert answer.server == "s-d1" and not answer.reconstructed
        np.testing.assert_allclose(answer.outputs, x3 @ WEIGHTS, rtol=1e-5)
