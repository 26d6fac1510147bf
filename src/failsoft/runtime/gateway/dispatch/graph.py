"""The ``graph`` dispatcher: HAMS's request path, one request walking a DAG of member apps.

* Every request gets a sequence number (``seq``, from 1, in arrival order); it walks the graph from
  its entry nodes to its sinks. An entry node takes the request's batch, a node with one input its
  upstream's output, and a fan-in (HAMS ``reduce``, :attr:`~failsoft.services.GraphNode.joins`) the
  outputs of its inputs *for the same request*, concatenated along the last axis in ``joins``
  order. A fan-out (HAMS ``dist``) hands one output to several nodes, which run concurrently.
* Each node is called through the ``single`` dispatcher's machinery (:class:`SingleDispatcher`):
  its app's current route, retried on a newer route until the deadline, withdrawn when it is left.
  A stateless node that fails over is therefore just a slower answer, as for a ``single`` service.
* A stateful node computes requests in ``seq`` order (HAMS III: its state after ``seq`` is the
  state after 1..``seq``): a request waits at it until the one before it has passed or failed.
* Every node's outputs are kept by ``seq`` (:attr:`GraphDispatcher.edge_log`, the last
  ``log_limit`` requests): an edge's log is its upstream node's outputs, what a replay after a
  stateful failover delivers again.
* A request failing inside the graph answers the node's error class (4xx/5xx by
  :func:`~failsoft.errors.http_status`), its message naming the service and the node; the requests
  around it are unaffected (they neither wait for it nor share its outputs).

* A stateful node runs on a primary and a backup copy (:mod:`.graph_replication`): its state is shipped to the
  backup without stopping the pipeline (the ``nspb`` protocol), and a failed primary's backup is
  promoted, the node's logged inputs since its last durable state replayed on it, and the graph
  goes on. What is not carried out yet is in :mod:`.graph_replication`'s docstring and docs/hams.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np

from failsoft.errors import FailsoftError
from failsoft.policies.replication.interface import Topology
from failsoft.runtime.gateway.dispatch.graph_replication import Replication
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.gateway.dispatch.single import SingleDispatcher
from failsoft.services import GraphParams, Service, ServiceMode

LOG_LIMIT = 1024  # requests each node's output log keeps


class GraphDispatcher(Dispatcher):
    """A DAG of member apps, one ``single`` route per node; stateful nodes in ``seq`` order."""

    mode = ServiceMode.GRAPH

    def __init__(self, service: Service, context: DispatchContext, log_limit: int = LOG_LIMIT) -> None:
        super().__init__(service, context)
        assert isinstance(service.params, GraphParams)
        self.graph = service.params
        self.topology = Topology(self.graph)
        self.nodes = {n.name: n for n in self.graph.nodes}
        self._calls = {  # a stateful node is not moved by the gateway's shortcut: its promotion is the core's
            n.name: SingleDispatcher(Service.single(n.app), context, shortcut=not n.stateful)
            for n in self.graph.nodes
        }
        self.log_limit = log_limit
        self.edge_log: dict[str, OrderedDict[int, Any]] = {n: OrderedDict() for n in self.nodes}
        self._seq = 0
        # a stateful node's turn: the future the previous request sets once it has left the node
        self._turn: dict[str, asyncio.Future[None] | None] = {n: None for n in self.topology.stateful}
        self.replication = (
            Replication(service.name, self.graph, context, self.edge_log, log_limit, self.graph.replication)
            if self.topology.stateful
            else None
        )

    def _serving(self, node: str) -> bool:
        rep = self.replication
        if rep is not None and node in rep.nodes and rep.serving(node):
            return True  # a promoted copy serves it, whatever the app's route
        return self._calls[node].ready()

    def ready(self) -> bool:
        if self.replication is not None:
            self.replication.start()
        return all(self._serving(node) for node in self._calls)

    def front_app(self) -> str:
        return front_app(self.service)

    async def start(self) -> None:
        """Place the stateful nodes' backups (also done on first use, for a dispatcher driven alone)."""
        if self.replication is not None:
            self.replication.start()

    async def close(self) -> None:
        if self.replication is not None:  # its state transfers and backup placements
            await self.replication.close()

    def describe(self) -> dict[str, Any]:
        nodes = {name: call.describe() for name, call in self._calls.items()}
        down = sorted(name for name in nodes if not self._serving(name))
        out: dict[str, Any] = {
            "state": "UNAVAILABLE" if down else "READY",
            "reason": f"node(s) {down} have no live server" if down else "",
            "nodes": nodes,
            "requests": self._seq,
        }
        if self.replication is not None:
            self.replication.start()
            replication = out["replication"] = self.replication.describe()
            for name, rep in replication["nodes"].items():
                if self.replication.serving(name):
                    nodes[name] = {**nodes[name], "state": "READY", "server": rep["primary"]}
        return out

    async def dispatch(self, request: Request) -> Answer:
        if self.replication is not None:
            self.replication.start()
        self._seq += 1
        seq = self._seq
        loop = asyncio.get_running_loop()
        # take every stateful node's turn now, in arrival order, so that seq order holds at each
        mine: dict[str, tuple[asyncio.Future[None] | None, asyncio.Future[None]]] = {}
        for node in self.topology.stateful:
            done: asyncio.Future[None] = loop.create_future()
            mine[node] = (self._turn[node], done)
            self._turn[node] = done
        tasks: dict[str, asyncio.Task[Answer]] = {}
        for node in self.topology.order:
            tasks[node] = asyncio.ensure_future(self._node(node, seq, request, tasks, mine.get(node)))
        try:
            await asyncio.gather(*tasks.values())
        except BaseException:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            raise
        finally:
            for _, done in mine.values():
                if not done.done():
                    done.set_result(None)
        answers = {node: tasks[node].result() for node in self.topology.order}
        sinks = [answers[s] for s in self.topology.sinks]
        last = sinks[-1]
        # a request that crossed a failed-over node answers as that node's route (the latest one
        # detected, if several): the gateway counts the service's recovery by it
        recovered = max(
            (a for a in answers.values() if a.detected_at is not None),
            key=lambda a: a.detected_at or 0.0,
            default=last,
        )
        return Answer(
            outputs=sinks[0].outputs if len(sinks) == 1 else _join([a.outputs for a in sinks]),
            server=last.server,
            variant=last.variant,
            degraded=any(a.degraded for a in answers.values()),
            accuracy=min(a.accuracy for a in sinks),
            kind=recovered.kind,
            attempts=sum(a.attempts for a in answers.values()),
            detected_at=recovered.detected_at,
            route_at=recovered.route_at,
            extra=(("seq", seq), ("servers", {n: a.server for n, a in answers.items()})),
        )

    async def _node(
        self,
        node: str,
        seq: int,
        request: Request,
        tasks: dict[str, asyncio.Task[Answer]],
        turn: tuple[asyncio.Future[None] | None, asyncio.Future[None]] | None,
    ) -> Answer:
        inputs = self.topology.inputs[node]
        if inputs:
            ups = [await tasks[up] for up in (self.nodes[node].joins or inputs)]
            batch = ups[0].outputs if len(ups) == 1 else _join([a.outputs for a in ups])
        else:
            batch = request.batch
        try:
            if turn is not None and turn[0] is not None:
                await asyncio.shield(turn[0])
            call = Request(self.service.name, batch, request.deadline, f"{request.request_id}/{node}")
            try:
                if self.replication is not None and node in self.replication.nodes:
                    rid = call.request_id
                    answer = await self.replication.call(node, seq, batch, request.deadline, rid)
                else:
                    answer = await self._calls[node].dispatch(call)
            except FailsoftError as exc:
                exc.args = (f"service {self.service.name!r}, node {node!r}: {exc}", *exc.args[1:])
                raise
        finally:
            if turn is not None and not turn[1].done():
                turn[1].set_result(None)
        rep = self.replication
        if rep is not None and rep.holds and node in rep.nodes:  # stop-and-copy: the next computes on
            try:
                outputs = await rep.released(node, seq, answer.outputs, request.deadline)
            except FailsoftError as exc:
                exc.args = (f"service {self.service.name!r}, node {node!r}: {exc}", *exc.args[1:])
                raise
            answer = dataclasses.replace(answer, outputs=outputs)
        log = self.edge_log[node]
        log[seq] = answer.outputs
        while len(log) > self.log_limit:
            log.popitem(last=False)
        return answer


def front_app(service: Service) -> str:
    """The app whose input a request to ``service`` must fit: a graph's first entry node's app (every
    entry node takes the request's batch), any other mode's first member."""
    if isinstance(service.params, GraphParams):
        entry = Topology(service.params).entries[0]
        return next(n.app for n in service.params.nodes if n.name == entry)
    return service.members[0]


def _join(outputs: list[Any]) -> Any:
    """A fan-in's input: its upstream outputs for one request side by side (last axis)."""
    return np.concatenate([np.asarray(o) for o in outputs], axis=-1)
