"""The ``graph`` dispatcher on a manual clock: DAG walk, fan-out/fan-in, seq order, errors by node.

No Ray: routes are mirrored from a fake controller and agents are fakes on the virtual clock (the
live path is the ``single`` dispatcher's, tested live elsewhere); a fake agent is the only way to
make one node fail, or be slow, on cue and in a fixed order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from failsoft.clock import ManualClock
from failsoft.errors import OverloadedError, http_status
from failsoft.runtime.gateway.dispatch import DispatchContext, GraphDispatcher, Request, dispatcher_class
from failsoft.runtime.gateway.dispatch.graph import front_app
from failsoft.services import GraphNode, GraphParams, Service, ServiceMode
from tests.runtime.gateway.fakes import FakeAgent, mirrored, route_entry, sync

# the fatigue shape: a -> (b, c) -> d joins b and c; c is stateful
NODES = (
    GraphNode("a", "app-a"),
    GraphNode("b", "app-b"),
    GraphNode("c", "app-c", stateful=True),
    GraphNode("d", "app-d", joins=("b", "c")),
)
EDGES = (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))
SERVICE = Service("dag", ServiceMode.GRAPH, tuple(n.app for n in NODES), GraphParams(NODES, EDGES))


class EchoAgent(FakeAgent):
    """Adds its app's index to the batch (so a join's output shows which inputs it got); records order."""

    def __init__(self, server: str, clock: ManualClock, delays: dict[str, float] | None = None) -> None:
        super().__init__(server, clock)
        self.delays = delays or {}
        self.order: list[tuple[str, str | None]] = []
        self.fail: set[str] = set()

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        self.order.append((app, request_id))
        if request_id is not None and request_id in self.fail:
            raise OverloadedError("queue full")
        await self.clock.sleep(self.delays.get(f"{app}:{request_id}", 0.01))
        return np.asarray(batch, dtype=np.float32) + 1.0


def _run(fn: Any, delays: dict[str, float] | None = None) -> None:
    async def go() -> None:
        clock = ManualClock(1000.0)
        agent = EchoAgent("s1", clock, delays)
        routes = {n.app: route_entry("s1", "v") for n in NODES}
        async with mirrored(clock, routes) as (_, mirror):
            context = DispatchContext(mirror, lambda s: agent, clock)  # type: ignore[arg-type, return-value]
            await fn(clock, agent, GraphDispatcher(SERVICE, context))

    sync(go)()


def _send(clock: ManualClock, d: GraphDispatcher, rid: str) -> asyncio.Task[Any]:
    batch = np.zeros((1, 2), dtype=np.float32)
    return asyncio.ensure_future(d.dispatch(Request("dag", batch, clock.now() + 2.0, rid)))


def test_graph_mode_has_a_dispatcher() -> None:
    assert dispatcher_class(SERVICE) is GraphDispatcher


def test_request_walks_the_dag_fan_out_and_fan_in() -> None:
    async def body(clock: ManualClock, agent: EchoAgent, d: GraphDispatcher) -> None:
        task = _send(clock, d, "r1")
        await clock.run_for(1.0)
        answer = task.result()
        # a: 1; b, c: 2 each; d joins [2, 2] and [2, 2] side by side and adds 1
        np.testing.assert_array_equal(answer.outputs, np.full((1, 4), 3.0))
        assert dict(answer.extra)["seq"] == 1
        assert answer.attempts == 4
        assert sorted(app for app, _ in agent.order) == ["app-a", "app-b", "app-c", "app-d"]
        assert agent.order[0] == ("app-a", "r1/a#1")  # the entry first, d last
        assert agent.order[-1][0] == "app-d"
        assert set(d.edge_log) == {"a", "b", "c", "d"} and list(d.edge_log["c"]) == [1]

    _run(body)


def test_stateful_node_computes_in_seq_order() -> None:
    # r1 is slow at a, so it reaches c after r2 would: c still computes r1 first
    async def body(clock: ManualClock, agent: EchoAgent, d: GraphDispatcher) -> None:
        t1, t2 = _send(clock, d, "r1"), _send(clock, d, "r2")
        await clock.run_for(2.0)
        assert t1.result() and t2.result()
        at_c = [rid for app, rid in agent.order if app == "app-c"]
        assert at_c == ["r1/c#1", "r2/c#1"]
        at_b = [rid for app, rid in agent.order if app == "app-b"]
        assert at_b == ["r2/b#1", "r1/b#1"]  # a stateless node does not wait
        assert list(d.edge_log["c"]) == [1, 2]

    _run(body, delays={"app-a:r1/a#1": 0.5})


def test_failing_node_is_named_and_later_requests_pass() -> None:
    async def body(clock: ManualClock, agent: EchoAgent, d: GraphDispatcher) -> None:
        agent.fail.add("r1/c#1")
        t1, t2 = _send(clock, d, "r1"), _send(clock, d, "r2")
        await clock.run_for(1.0)
        with pytest.raises(OverloadedError, match="service 'dag', node 'c': queue full") as err:
            t1.result()
        assert http_status(err.value) == 503
        assert dict(t2.result().extra)["seq"] == 2  # r2 did not wait for r1 forever at c
        assert 1 not in d.edge_log["c"] and 2 in d.edge_log["c"]

    _run(body)


def test_log_keeps_the_last_requests_only() -> None:
    async def body(clock: ManualClock, agent: EchoAgent, d: GraphDispatcher) -> None:
        d.log_limit = 2
        for i in range(4):
            _send(clock, d, f"r{i}")
        await clock.run_for(1.0)
        assert list(d.edge_log["d"]) == [3, 4]

    _run(body)


def test_requests_are_checked_against_the_entry_node() -> None:
    reordered = Service("dag", ServiceMode.GRAPH, ("app-d", "app-c", "app-b", "app-a"), SERVICE.params)
    assert front_app(reordered) == "app-a"
    assert front_app(Service.single("cam")) == "cam"
