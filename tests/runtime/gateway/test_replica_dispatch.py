"""The ``single`` dispatcher with replicas, on a manual clock: the power of two choices between the
route and its replicas, a dead replica's requests moved at once, a full queue's sent to another.

No Ray: the rig of :mod:`tests.runtime.gateway.test_single_dispatcher` (a fake controller's real
long-poll host, fake agents s1 and s2 on the virtual clock); app ``cam`` is routed to s1 and has a
replica on s2.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from failsoft.errors import OverloadedError, ServerUnavailableError
from tests.runtime.gateway.fakes import route_entry
from tests.runtime.gateway.test_single_dispatcher import DEADLINE_S, with_rig


def with_replica(
    server: str | None = "s2", autoscaling: bool = False, draining: tuple[str, ...] = ()
) -> dict[str, Any]:
    serving = [] if server is None else [{"server": server, "variant": "big", "accuracy": 0.9}]
    return {
        **route_entry("s1", "big"),
        "replicas": {"wanted": 2, "autoscaling": autoscaling, "serving": serving, "draining": list(draining)},
    }


async def replicated(rig, **kw: Any) -> None:
    rig.controller.set_route("cam", with_replica(**kw))
    await rig.clock.run_for(0)


@with_rig
async def test_requests_spread_over_the_route_and_its_replica_by_their_load(rig):
    await replicated(rig)
    assert [r.server for r in rig.dispatcher.context.routes.active("cam")] == ["s1", "s2"]
    assert rig.dispatcher.describe()["replicas"] == 2
    rig.agents["s1"].latency_s = 0.05  # s1 is slower: it holds its requests longer
    tasks = [rig.send(f"r{i}") for i in range(40)]
    await rig.clock.run_for(0)
    assert rig.dispatcher.ongoing() == {"cam": 40}
    await rig.clock.run_for(1.0)
    answers = [t.result() for t in tasks]
    by_server = Counter(a.server for a in answers)
    assert by_server["s1"] + by_server["s2"] == 40 and min(by_server.values()) >= 15
    kinds = {a.server: a.kind for a in answers}
    assert kinds == {"s1": "primary", "s2": "replica"}
    assert rig.dispatcher.ongoing() == {"cam": 0} and set(rig.dispatcher.in_flight.values()) == {0}


@with_rig
async def test_a_dead_replica_moves_its_requests_to_the_route_at_once(rig):
    await replicated(rig)
    rig.agents["s2"].error = ServerUnavailableError("server 's2': the actor died")
    tasks = [rig.send(f"r{i}") for i in range(10)]
    await rig.clock.run_for(0.05)  # no route change needed: the other replica takes them
    answers = [t.result() for t in tasks]
    assert {a.server for a in answers} == {"s1"}
    assert any(a.attempts == 2 for a in answers)  # those first sent to s2
    assert not [o for o in rig.outcomes if not o[1]]  # a dead server is the failover's, not health's


@with_rig
async def test_a_hung_replica_dropped_from_the_table_gives_its_requests_to_the_route(rig):
    await replicated(rig)
    rig.agents["s2"].latency_s = None
    tasks = [rig.send(f"r{i}") for i in range(6)]
    await rig.clock.run_for(0.5)
    stuck = [t for t in tasks if not t.done()]
    assert stuck and len(rig.agents["s2"].calls) == len(stuck)
    await replicated(rig, server=None)  # the controller failed s2 over: the replica is gone
    await rig.clock.run_for(0.05)
    assert all(t.result().server == "s1" for t in tasks)
    assert sorted(rig.agents["s2"].cancelled) == sorted(c["request_id"] for c in rig.agents["s2"].calls)
    assert rig.clock.now() - 1000.0 < DEADLINE_S


@with_rig
async def test_a_replica_dropped_by_a_scale_in_finishes_what_it_holds_and_takes_nothing_new(rig):
    await replicated(rig)
    rig.agents["s2"].latency_s = 0.3
    tasks = [rig.send(f"r{i}") for i in range(6)]
    await rig.clock.run_for(0.01)
    on_s2 = len(rig.agents["s2"].calls)
    assert on_s2
    await replicated(rig, server=None, draining=("s2",))  # scaled in: s2 drains
    late = rig.send("late")
    await rig.clock.run_for(0.5)
    assert late.result().server == "s1"
    assert sum(t.result().server == "s2" for t in tasks) == on_s2  # answered there, not moved
    assert not rig.agents["s2"].cancelled and len(rig.agents["s2"].calls) == on_s2


@with_rig
async def test_a_full_queue_sends_the_request_to_another_replica_and_all_full_is_503(rig):
    await replicated(rig)
    rig.agents["s1"].error = OverloadedError("s1: queue full")
    tasks = [rig.send(f"r{i}") for i in range(8)]
    await rig.clock.run_for(0.05)
    assert {t.result().server for t in tasks} == {"s2"}
    rig.agents["s2"].error = OverloadedError("s2: queue full")
    task = rig.send("last")
    await rig.clock.run_for(0.05)
    assert isinstance(task.exception(), OverloadedError)


@with_rig
async def test_the_mirror_says_which_apps_autoscale(rig):
    await replicated(rig, autoscaling=True)
    assert rig.dispatcher.context.routes.autoscaled == frozenset({"cam"})
    await asyncio.sleep(0)


def test_metrics_export_replicas_and_ongoing_requests_per_app():
    from failsoft.runtime.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    metrics.watch_apps(lambda: {"cam": (2, 3), "mic": (1, 0)})
    text = metrics.render(7, True, None).decode()
    assert 'failsoft_app_replicas{app="cam"} 2.0' in text
    assert 'failsoft_app_ongoing_requests{app="cam"} 3.0' in text
    assert 'failsoft_app_replicas{app="mic"} 1.0' in text


def test_the_gateway_reports_autoscaled_apps_ongoing_requests_and_exports_them():
    import time

    from starlette.testclient import TestClient

    from failsoft.clock import MonotonicClock
    from tests.runtime.gateway.fakes import FakeAgent
    from tests.runtime.gateway.test_gateway import gateway_of

    clock = MonotonicClock()
    agents = {s: FakeAgent(s, clock, latency_s=0.0) for s in ("s1", "s2")}  # type: ignore[arg-type]
    gateway = gateway_of(agents)
    controller = gateway.controller
    controller.set_route("cam", with_replica(autoscaling=True))  # type: ignore[attr-defined]
    with TestClient(gateway.app) as client:
        deadline = time.monotonic() + 10.0
        while not controller.ongoing_reports and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.05)
        metrics = client.get("/metrics").text
    assert controller.ongoing_reports[0] == {"cam": 0}  # type: ignore[attr-defined]  # ocr does not scale
    assert 'failsoft_app_replicas{app="cam"} 2.0' in metrics
    assert 'failsoft_app_replicas{app="ocr"} 1.0' in metrics
    assert 'failsoft_app_ongoing_requests{app="cam"} 0.0' in metrics
