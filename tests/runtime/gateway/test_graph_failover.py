"""A graph's stateful node on a primary and a backup, on a manual clock: state shipped without
stopping the pipeline, a killed primary's backup promoted, its logged inputs replayed, and every
answer equal to a failure-free run's.

No Ray: fake agents share one clock, and each holds fake stateful models whose answer depends on
every request before (``out = acc + x``, then ``acc = 2 acc + x + 1``, per row), with a state in the
wire form's header (``seq``: rows folded in). Killing a fake server makes every call to it raise
ServerUnavailableError, as a dead agent's calls do; the live test is ``tests/runtime/
test_graph_failover.py``.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import numpy as np

from failsoft.clock import ManualClock
from failsoft.errors import DeadlineExceededError, ModelNotLoadedError, ServerUnavailableError
from failsoft.runtime.gateway.dispatch import DispatchContext, GraphDispatcher, Request
from failsoft.runtime.gateway.dispatch.graph_replication import state_seq
from failsoft.runtime.gateway.routes import Route
from failsoft.services import GraphNode, GraphParams, Service, ServiceMode
from tests.runtime.gateway.fakes import mirrored, route_entry, sync

# a -> c (stateful) -> d: a stateless entry, the stateful node, a stateless sink
NODES = (GraphNode("a", "app-a"), GraphNode("c", "app-c", stateful=True), GraphNode("d", "app-d"))
EDGES = (("a", "c"), ("c", "d"))
SERVICE = Service("dag", ServiceMode.GRAPH, tuple(n.app for n in NODES), GraphParams(NODES, EDGES))
SERVERS = ("s1", "s2", "s3")


def _state_bytes(seq: int, acc: float) -> bytes:
    header = json.dumps({"__metadata__": {"seq": str(seq), "acc": repr(float(acc))}}).encode()
    return struct.pack("<Q", len(header)) + header


class Model:
    def __init__(self) -> None:
        self.seq, self.acc = 0, 0.0

    def compute(self, batch: Any) -> np.ndarray:
        out = []
        for x in np.asarray(batch, dtype=np.float64)[:, 0]:
            out.append(self.acc + x)
            self.acc = 2 * self.acc + x + 1
            self.seq += 1
        return np.asarray(out, dtype=np.float64)[:, None]


class StatefulAgent:
    """A server: app-c's models are stateful (:class:`Model`), the others add 1."""

    def __init__(self, server: str, clock: ManualClock, apply_s: float) -> None:
        self.server, self.clock, self.apply_s = server, clock, apply_s
        self.models: dict[tuple[str, str], Model] = {}
        self.dead = False
        self.hung = False  # a stopped process: calls never answer
        self.calls: list[tuple[str, str | None]] = []
        self.applied: list[int] = []
        self.applied_at: list[tuple[float, int]] = []  # (when, seq)
        self.state_errors = 0  # the next this many state reads fail (a process too busy to answer)

    async def _check_async(self) -> None:
        self._check()
        if self.hung:
            await asyncio.Future()

    def _check(self) -> None:
        if self.dead:
            raise ServerUnavailableError(f"server {self.server!r}: unavailable (RayActorError)")

    async def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        self._check()
        await self.clock.sleep(0.05)
        self._check()
        self.models.setdefault((app, variant), Model())
        return {}

    async def infer(
        self, app: str, variant: str, batch: Any, timeout_s: float, request_id: str | None = None
    ) -> np.ndarray:
        await self._check_async()
        self.calls.append((app, request_id))
        await self.clock.sleep(0.01)
        await self._check_async()
        if not app.startswith("app-c"):
            return np.asarray(batch, dtype=np.float64) + 1.0
        model = self.models.get((app, variant))
        if model is None:
            raise ModelNotLoadedError(f"{self.server} does not hold {app}")
        return model.compute(batch)

    async def state(self, app: str, variant: str) -> bytes:
        await self._check_async()
        if self.state_errors > 0:
            self.state_errors -= 1
            raise DeadlineExceededError(f"server {self.server!r}: state read timed out")
        model = self.models[(app, variant)]
        data = _state_bytes(model.seq, model.acc)  # taken at once, between two requests
        await self.clock.sleep(0.002)
        self._check()
        return data

    async def apply_state(self, app: str, variant: str, data: bytes) -> int:
        self._check()
        await self.clock.sleep(self.apply_s)
        self._check()
        (size,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8 : 8 + size])["__metadata__"]
        model = self.models[(app, variant)]
        model.seq, model.acc = int(meta["seq"]), float(meta["acc"])
        self.applied.append(model.seq)
        self.applied_at.append((self.clock.now(), model.seq))
        return model.seq

    async def unload(self, app: str, variant: str) -> bool:
        self._check()
        return self.models.pop((app, variant), None) is not None

    def cancel_nowait(self, request_id: str) -> None:
        return None


def _scenario(
    kill: str | None,
    apply_s: float = 0.005,
    n: int = 40,
    servers: tuple[str, ...] = SERVERS,
    detect_s: float = 0.0,
    service: Service = SERVICE,
    state_errors: int = 0,
    settle_s: float = 2.0,
    reload_s: float | None = None,
    fails: bool = False,
) -> dict[str, Any]:
    """Send ``n`` requests 20 ms apart (each walks the graph in ~30 ms: two in flight at a time);
    kill ``kill`` (``"primary"`` or ``"backup"`` of c; ``"hang"``: stop c's primary; ``"model"``:
    c's primary loses its model, its server living on; ``reload_s``: the controller's stand-in then
    reloads it in place when no pinned copy is ready) after the 15th is sent (``fails``: requests
    may fail, counted in ``failed``; otherwise the first failure is raised). Returns the answers
    by seq, the agents, the dispatcher's replication report, and its route log."""
    out: dict[str, Any] = {}

    async def go() -> None:
        clock = ManualClock(1000.0)
        agents = {s: StatefulAgent(s, clock, apply_s) for s in SERVERS}
        routes = {
            "app-a": route_entry("s3", "v"),
            "app-c": route_entry("s1", "v"),
            "app-d": route_entry("s3", "v"),
        }
        for app in ("app-a", "app-c", "app-d"):
            server = routes[app]["route"]["server"]
            agents[server].models[(app, "v")] = Model()

        def agent(server: str) -> StatefulAgent:
            return agents[server]

        async with mirrored(clock, routes) as (controller, mirror):
            controller.agents, controller.allowed = agents, servers  # the core's stand-in places backups
            controller.reload_s = reload_s
            context = DispatchContext(mirror, agent, clock, copies=controller)  # type: ignore[arg-type]
            d = GraphDispatcher(service, context)
            assert d.ready()
            await clock.run_for(0.5)  # the backup is placed and holds the state after 0
            agents["s1"].state_errors = state_errors
            out["placed"] = d.describe()["replication"]["nodes"]["c"]
            tasks: list[asyncio.Future[Any]] = []
            done_at: dict[int, float] = {}
            moves: list[asyncio.Future[None]] = []
            for i in range(n):
                batch = np.full((1, 1), float(i % 7), dtype=np.float64)
                req = Request("dag", batch, clock.now() + 5.0, f"r{i}")
                task = asyncio.ensure_future(d.dispatch(req))
                task.add_done_callback(lambda t, i=i: done_at.__setitem__(i, clock.now()))
                tasks.append(task)
                await clock.run_for(0.02)
                if i == 15 and kill == "model":  # the primary's model is gone, its server lives on
                    out["killed"] = victim = d.describe()["replication"]["nodes"]["c"]["primary"]
                    del agents[victim].models[("app-c", "v")]
                elif i == 15 and kill is not None:
                    report = d.describe()["replication"]["nodes"]["c"]
                    victim = report["backup"] if kill == "backup" else report["primary"]
                    out["killed"] = victim
                    agents[victim].dead = kill != "hang"
                    agents[victim].hung = kill == "hang"
                    if kill == "backup":
                        controller.fail_server(victim)
                    else:  # the controller fails the app over: to its pinned backup, or a fresh copy
                        other = next(s for s in SERVERS if s not in (victim, report["backup"]))
                        delay = detect_s or (0.05 if kill == "hang" else 0.0)  # heartbeats missed
                        move = _move(clock, controller, victim, agents[other], delay)
                        moves.append(asyncio.ensure_future(move))
            await clock.run_for(settle_s)
            waiting = sum(not t.done() for t in tasks)
            assert not waiting, f"{waiting} requests still waiting after the run"
            failed = [t.exception() for t in tasks if t.exception() is not None]
            if failed and not fails:
                raise failed[0]  # type: ignore[misc]
            out["failed"] = len(failed)
            answered = [(i, t.result()) for i, t in enumerate(tasks) if t.exception() is None]
            out["answers"] = {dict(a.extra)["seq"]: a for _, a in answered}
            out["done_at"] = {dict(a.extra)["seq"]: done_at[i] for i, a in answered}
            out["report"] = d.describe()["replication"]["nodes"]["c"]
            out["node"], out["ready"] = d.describe()["nodes"]["c"], d.ready()
            out["agents"], out["lost_reports"] = agents, list(controller.lost_reports)
            pending = d.replication._tasks if d.replication is not None else set()
            out["working_before_close"] = sum(not t.done() for t in pending)
            await d.close()  # what the gateway does when it stops
            out["working_after_close"] = sum(not t.done() for t in pending)

    sync(go)()
    return out


async def _move(clock: ManualClock, controller: Any, victim: str, agent: StatefulAgent, delay: float) -> None:
    """The controller's failover of app-c, ``delay`` later, as the core decides it: to its warm
    pinned copy (the backup) when it has one elsewhere, else to a fresh copy on ``agent``'s server."""
    await clock.sleep(delay)
    controller.fail_server(victim)
    ready = [p for p in controller.pinned("app-c") if p["ready"]]
    if ready:
        controller.promote("app-c", ready[0]["server"], ready[0]["variant"])
        return
    agent.models[("app-c", "v")] = Model()
    controller.set_route("app-c", route_entry(agent.server, "v"))


def _outputs(run: dict[str, Any]) -> list[float]:
    return [float(np.asarray(run["answers"][s].outputs)[0, 0]) for s in sorted(run["answers"])]


def test_state_is_shipped_to_a_backup_on_another_server_without_holding_outputs() -> None:
    run = _scenario(kill=None)
    assert run["placed"]["primary"] == "s1" and run["placed"]["backup"] in ("s2", "s3")
    assert run["placed"]["backup_holds"] == 0
    report = run["report"]
    assert report["durable"] == 40 and report["failovers"] == 0
    backup = run["agents"][report["backup"]]
    assert backup.applied[-1] == 40  # rows folded in
    assert ("app-c", "v") not in backup.models  # the dispatcher gave its backup up when it closed
    assert backup.applied == sorted(backup.applied) and len(backup.applied) >= 10
    assert sorted(run["answers"]) == list(range(1, 41))
    # the reference by hand: a adds 1, c is the recurrence, d adds 1
    acc, expected = 0.0, []
    for i in range(40):
        x = float(i % 7) + 1.0
        expected.append(acc + x + 1.0)
        acc = 2 * acc + x + 1
    assert _outputs(run) == expected


def test_a_killed_primary_is_replaced_by_its_backup_and_the_answers_equal_a_failure_free_run() -> None:
    # the backup applies slowly (25 ms), so its state lags: the failover must replay requests
    reference = _scenario(kill=None, apply_s=0.025)
    run = _scenario(kill="primary", apply_s=0.025)
    report = run["report"]
    assert run["killed"] == "s1"
    assert report["failovers"] == 1 and report["lost"] == 0
    assert report["primary"] == run["placed"]["backup"]  # the backup was promoted
    assert run["node"]["server"] == report["primary"] and run["node"]["state"] == "READY" and run["ready"]
    assert report["replayed"] >= 1 and report["divergent"] == 0
    assert report["backup"] not in (None, "s1", report["primary"])  # a new backup was placed
    assert report["durable"] == 40  # and the state goes on reaching it
    assert sorted(run["answers"]) == list(range(1, 41))  # every request answered, none failed
    assert _outputs(run) == _outputs(reference)
    late = [a for s, a in run["answers"].items() if s > 20]
    assert all(dict(a.extra)["servers"]["c"] == report["primary"] for a in late)
    # the controller's fresh copy of app-c (its state lost) never served the graph
    other = run["agents"][next(s for s in SERVERS if s not in ("s1", report["primary"]))]
    assert not [rid for app, rid in other.calls if app == "app-c"]


def test_a_hung_primary_is_left_when_the_controller_moves_its_app() -> None:
    reference = _scenario(kill=None, apply_s=0.025)
    run = _scenario(kill="hang", apply_s=0.025)
    report = run["report"]
    assert report["failovers"] == 1 and report["lost"] == 0
    assert report["primary"] == run["placed"]["backup"] and report["durable"] == 40
    assert sorted(run["answers"]) == list(range(1, 41))
    assert _outputs(run) == _outputs(reference)


def test_a_primary_that_lost_its_model_on_a_live_server_is_reported_and_its_backup_promoted() -> None:
    """Nothing moves the route by itself (the server heartbeats): the request that finds the model
    gone reports it (``report_model_lost``), the core's stand-in promotes the backup as the real core
    does, and the node fails over exactly as for a crash. Without the report the request waits for
    a route change until its deadline."""
    reference = _scenario(kill=None, apply_s=0.025)
    run = _scenario(kill="model", apply_s=0.025)
    report = run["report"]
    assert run["killed"] == "s1" and not run["agents"]["s1"].dead
    assert set(run["lost_reports"]) == {("app-c", "s1", "v")}
    assert report["failovers"] == 1 and report["lost"] == 0 and report["divergent"] == 0
    assert report["primary"] == run["placed"]["backup"]  # the backup was promoted
    assert report["backup"] not in (None, report["primary"])  # and a new one placed
    assert report["durable"] == 40
    assert sorted(run["answers"]) == list(range(1, 41))  # every request answered, none failed
    assert _outputs(run) == _outputs(reference)


def test_a_primary_that_lost_its_model_with_no_backup_is_reloaded_in_place_and_its_request_answered() -> None:
    """No backup holds a state (only s1 may hold a copy, as before the first backup is placed):
    the core reloads the model in place, unrouting the app meanwhile (200 ms here). The request that
    found the model gone waits for the new route on the same server and is computed there from the
    initial state (``lost: 1``), as after a crash without a backup; none fails at its deadline."""
    reference = _scenario(kill=None, servers=("s1",))
    run = _scenario(kill="model", servers=("s1",), reload_s=0.2)
    report = run["report"]
    assert run["placed"]["backup"] is None and report["backup"] is None
    assert run["killed"] == "s1" and not run["agents"]["s1"].dead
    assert set(run["lost_reports"]) == {("app-c", "s1", "v")}
    assert report["primary"] == "s1" and report["failovers"] == 1 and report["lost"] == 1
    assert sorted(run["answers"]) == list(range(1, 41))  # every request answered, none failed
    same = sum(a == b for a, b in zip(_outputs(run), _outputs(reference), strict=True))
    assert 15 <= same < 40  # equal until the loss, then from the initial state: they differ


def test_without_a_reload_a_primary_that_lost_its_model_with_no_backup_never_answers() -> None:
    """The same loss with the controller's stand-in only recording the report: the route never
    changes, so the node waits until every request's deadline (what the reload in place ends)."""
    run = _scenario(kill="model", servers=("s1",), settle_s=6.0, reload_s=None, fails=True)
    assert run["failed"] and run["report"]["lost"] == 0


def test_a_killed_backup_is_replaced_and_the_primary_never_stops() -> None:
    reference = _scenario(kill=None)
    run = _scenario(kill="backup")
    report = run["report"]
    assert report["failovers"] == 0 and report["primary"] == "s1"
    assert report["backup"] not in (None, run["killed"], "s1")
    assert report["durable"] == 40
    assert _outputs(run) == _outputs(reference)


def test_a_transfer_is_retried_until_the_primary_answers_however_long_it_takes() -> None:
    # the primary cannot give its state 80 times in a row (16 s of quick tries and more): the one
    # transfer in flight must not be dropped, or the protocol never asks again and the backup stays
    # behind for good
    run = _scenario(kill=None, state_errors=80, settle_s=60.0)
    assert run["agents"]["s1"].state_errors == 0
    assert run["report"]["durable"] == 40 and run["report"]["failovers"] == 0
    assert sorted(run["answers"]) == list(range(1, 41))  # the pipeline never waited for it


def test_closing_the_dispatcher_stops_a_transfer_that_would_retry_for_ever() -> None:
    run = _scenario(kill=None, state_errors=10**6, settle_s=5.0)
    assert run["report"]["durable"] < 40  # the primary never gave its state: still trying
    assert run["working_before_close"] >= 1 and run["working_after_close"] == 0


def test_state_seq_reads_the_header() -> None:
    assert state_seq(_state_bytes(17, 3.0)) == 17


def test_without_a_backup_the_node_goes_back_to_its_route_and_its_state_is_lost() -> None:
    # only s1 may hold a copy of the dispatcher's: no backup is ever placed (as with ``none``)
    reference = _scenario(kill=None, servers=("s1",))
    run = _scenario(kill="primary", servers=("s1",), detect_s=0.1)  # the route moves 100 ms later
    report = run["report"]
    assert run["placed"]["backup"] is None and report["backup"] is None
    assert report["failovers"] == 1 and report["lost"] == 1  # it waited for the route to move
    assert report["primary"] == "s2"  # the controller's new copy, from its initial state
    assert sorted(run["answers"]) == list(range(1, 41))  # still no request fails
    got, want = _outputs(run), _outputs(reference)
    assert got[:15] == want[:15] and got[20:] != want[20:]  # what it had learned is gone


def test_replication_none_places_no_backup_ships_no_state_and_loses_it_at_a_failover() -> None:
    params = GraphParams(NODES, EDGES, replication="none")
    none = Service("dag", ServiceMode.GRAPH, SERVICE.members, params)
    reference = _scenario(kill=None, service=none)
    assert _outputs(reference) == _outputs(_scenario(kill=None))  # no failure: the same answers
    run = _scenario(kill="primary", detect_s=0.1, service=none)
    report = run["report"]
    assert run["placed"]["backup"] is None and report["backup"] is None and report["durable"] == 0
    assert not any(a.applied for a in run["agents"].values())  # no state was ever applied
    assert report["failovers"] == 1 and report["lost"] == 1 and report["primary"] == "s2"
    assert sorted(run["answers"]) == list(range(1, 41))
    got, want = _outputs(run), _outputs(reference)
    assert got[:15] == want[:15] and got[20:] != want[20:]


def test_a_ship_interval_spaces_the_transfers_and_a_failover_replays_the_lag() -> None:
    params = GraphParams(NODES, EDGES, ship_interval_ms=100.0)
    spaced = Service("dag", ServiceMode.GRAPH, SERVICE.members, params)
    every = _scenario(kill=None)
    run = _scenario(kill=None, service=spaced)
    assert _outputs(run) == _outputs(every) and run["report"]["durable"] == 40
    applied = [len(a.applied) for r in (every, run) for a in r["agents"].values()]
    assert sum(applied[3:]) <= 12 < sum(applied[:3])  # 0.8 s of requests: at most ~10 transfers
    failed = _scenario(kill="primary", service=spaced)
    assert failed["report"]["replayed"] >= 1 and failed["report"]["lost"] == 0
    assert _outputs(failed) == _outputs(every)  # the lag was replayed


def _policy(policy: str) -> Service:
    return Service("dag", ServiceMode.GRAPH, SERVICE.members, GraphParams(NODES, EDGES, replication=policy))


def test_stop_and_copy_holds_each_output_until_its_state_is_applied_and_fails_over_exactly() -> None:
    # applies take 25 ms: every answer waits for one; the primary computes on meanwhile
    every = _scenario(kill=None, apply_s=0.025)
    held = _scenario(kill=None, apply_s=0.025, service=_policy("stop-and-copy"))
    assert _outputs(held) == _outputs(every) and held["report"]["durable"] == 40
    backup = held["agents"][held["report"]["backup"]]
    assert backup.applied[-1] == 40

    def applied_by(run: dict[str, Any], seq: int) -> float:  # when a backup first held seq's state
        times = [t for a in run["agents"].values() for t, s in a.applied_at if s >= seq]
        return min(times, default=float("inf"))

    # every answer came after the state it left was at the backup; with nspb, most came before
    assert all(held["done_at"][s] >= applied_by(held, s) for s in held["answers"])
    assert sum(every["done_at"][s] < applied_by(every, s) for s in every["answers"]) > 20
    failed = _scenario(kill="primary", apply_s=0.025, service=_policy("stop-and-copy"))
    report = failed["report"]
    assert report["failovers"] == 1 and report["lost"] == 0 and report["divergent"] == 0
    assert sorted(failed["answers"]) == list(range(1, 41))
    assert _outputs(failed) == _outputs(every)


def test_a_state_shipped_again_while_its_first_apply_waits_to_start_is_applied_too() -> None:
    """The flake of the live concurrent test: after an upstream failover the protocol may ship one
    state (one ``seq``) twice; its bytes must go with each ``ApplyState`` as it is commanded, or the
    first apply throws the second's away and the node's state is never durable again."""
    from failsoft.policies.replication.interface import ApplyState
    from failsoft.runtime.gateway.dispatch.graph_replication import Copy

    async def go() -> None:
        clock = ManualClock(1000.0)
        agents = {s: StatefulAgent(s, clock, 0.005) for s in SERVERS}
        agents["s2"].models[("app-c", "v")] = Model()
        routes = {app: route_entry(server, "v") for app, server in (("app-a", "s3"), ("app-c", "s1"))}
        routes["app-d"] = route_entry("s3", "v")
        async with mirrored(clock, routes) as (controller, mirror):
            context = DispatchContext(mirror, agents.__getitem__, clock, copies=controller)  # type: ignore[arg-type]
            d = GraphDispatcher(SERVICE, context)
            rep = d.replication
            assert rep is not None
            node = rep.nodes["c"]
            node.backup = Copy("s2", "app-c", "v")
            epoch = rep._epoch("c")
            node.buffered[5] = _state_bytes(5, 1.0)
            rep._run([ApplyState("c", 5, epoch)])
            node.buffered[5] = _state_bytes(5, 2.0)  # shipped again before the first apply started
            rep._run([ApplyState("c", 5, epoch)])
            await clock.run_for(0.1)
            assert agents["s2"].applied == [5, 5]
            assert agents["s2"].models[("app-c", "v")].acc == 2.0  # the newer bytes, applied last
            await rep.close()

    sync(go)()


def test_an_apply_commanded_just_before_the_failover_is_carried_out_before_the_promotion() -> None:
    """The protocol counts a commanded apply as the backup's state (applies are atomic): a failover
    promotes the backup with the state being applied and replays only what comes after it. An apply
    commanded in the same turn of the event loop as the request that finds the primary dead (its
    task not started yet) must still reach the backup, or the promoted copy lacks a request the
    replay skips and every later answer differs: the apply's task once checked the epoch when it
    started, after the failover had begun a new one, and gave the apply up."""
    from failsoft.policies.replication.interface import ApplyState, OutputComputed, StateApplied, StateShipped
    from failsoft.runtime.gateway.dispatch.graph_replication import Copy

    async def go() -> None:
        clock = ManualClock(1000.0)
        agents = {s: StatefulAgent(s, clock, 0.005) for s in SERVERS}
        truth = agents["s1"].models[("app-c", "v")] = Model()
        states = {}
        for s in range(1, 6):  # the primary computes requests 1..5; the states after 1 and 5
            truth.compute(np.full((1, 1), float(s)))
            states[s] = _state_bytes(truth.seq, truth.acc)
        backup = agents["s2"].models[("app-c", "v")] = Model()
        routes = {app: route_entry(server, "v") for app, server in (("app-a", "s3"), ("app-c", "s1"))}
        routes["app-d"] = route_entry("s3", "v")
        async with mirrored(clock, routes) as (controller, mirror):
            controller.agents, controller.allowed = agents, ("s3",)
            context = DispatchContext(mirror, agents.__getitem__, clock, copies=controller)  # type: ignore[arg-type]
            d = GraphDispatcher(SERVICE, context)
            rep = d.replication
            assert rep is not None
            node, protocol = rep.nodes["c"], rep.protocol
            dead, promoted = Copy("s1", "app-c", "v"), Copy("s2", "app-c", "v")
            node.primary, node.backup, node.rows_now = dead, promoted, 5
            apply_1 = asyncio.ensure_future(agents["s2"].apply_state("app-c", "v", states[1]))
            await clock.run_for(0.01)
            assert apply_1.done() and backup.seq == 1
            for s in range(1, 6):  # the protocol's side: 1..5 computed, state 1 applied, 5 shipped
                protocol.handle(OutputComputed("c", s))
            protocol.handle(StateShipped("c", 1, 0))
            protocol.handle(StateApplied("c", 1, 0))
            commands = protocol.handle(StateShipped("c", 5, 0))
            assert ApplyState("c", 5, 0) in commands
            controller.promote("app-c", "s2", "v")  # s1 died: the core switched to the pinned copy
            await clock.run_for(0)
            assert mirror.route("app-c") is not None and mirror.route("app-c").server == "s2"
            # request 6 found s1 dead and begins its failover; in the same turn, state 5's apply is
            # commanded (its transfer had just come in): its task starts after the failover's
            sent_on = Route("s1", "v", "primary", False, 0.9, None, None)  # the route request 6 was sent on
            failover = asyncio.ensure_future(rep._failover(node, 6, dead, sent_on, clock.now() + 5.0))
            node.buffered[5] = states[5]
            rep._run([c for c in commands if isinstance(c, ApplyState)])
            await clock.run_for(0.5)
            assert failover.done() and failover.exception() is None
            assert node.primary == promoted and node.failovers == 1 and node.lost == 0
            assert agents["s2"].applied == [1, 5]  # the apply was carried out, then the promotion
            assert (backup.seq, backup.acc) == (truth.seq, truth.acc)  # it holds the state after 5
            await rep.close()

    sync(go)()
