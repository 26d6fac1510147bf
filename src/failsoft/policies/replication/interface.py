"""The replication seam's contract: events in, commands out, for one service graph.

A :class:`ReplicationProtocol` is a sans-I/O state machine: the gateway and the agents tell
it what happened (:data:`Event`), it answers what to do (:data:`Command`), and it never waits, sends
or reads a clock. The same object drives the runtime and the tests' reference harness.

Who reports what, and who carries out what:

=====================  ====================================================================
event                  reported by
=====================  ====================================================================
``RequestArrived``     gateway: every input of request ``seq`` at ``node`` is there
``OutputComputed``     node's primary: it computed ``seq`` (a stateful node's state moved on)
``StateShipped``       node's backup: the state after ``seq`` reached its buffer
``StateApplied``       node's backup: it applied that state (the state is now *durable*)
``Crashed``            failure detection: ``node``'s primary or backup died
``BackupPlaced``       controller: a new, empty backup of ``node`` is up
=====================  ====================================================================

=====================  ====================================================================
command                carried out by
=====================  ====================================================================
``Compute``            node's primary computes ``seq`` on the inputs the gateway delivered
``ReleaseOutput``      gateway: forward ``node``'s output of ``seq`` downstream (and log it)
``ReleaseToClient``    gateway: answer the client of request ``seq`` (the sinks' outputs)
``SendState``          node's primary ships its state after ``seq`` to its backup
``ApplyState``         node's backup applies the buffered state after ``seq`` (atomically)
``Promote``            node's backup becomes its primary, with its state after ``seq``
``Rollback``           node's primary takes its backup's state after ``seq``; the backup drops
                       the newer states it buffered
``Restore``            a fresh primary of ``node`` with the checkpoint after ``seq`` (0: the
                       model's initial state; a stateless node simply restarts)
``Replay``             gateway: drop ``node``'s outputs from ``from_seq`` on and deliver its
                       logged inputs again from there
``PlaceBackup``        controller: place a new backup of ``node`` (answered by ``BackupPlaced``)
=====================  ====================================================================

Requests are numbered by the gateway (``seq`` from 1); every request walks the whole graph, a node
computes requests in ``seq`` order, a fan-in joins its inputs of one ``seq``, and the gateway keeps
every node's released outputs by ``seq`` (the edge logs replays read). A state "after ``seq``" is
the node's state once it has computed requests 1..``seq``. ``epoch`` counts a node's role changes:
a state shipped or applied in an older epoch is stale and ignored, so a transfer from a dead
primary, or to a backup that has since been replaced, can land at any time without harm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from failsoft.services import GraphParams


class Role(StrEnum):
    PRIMARY = "primary"
    BACKUP = "backup"


@dataclass(frozen=True, slots=True)
class RequestArrived:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class OutputComputed:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class StateShipped:
    node: str
    seq: int
    epoch: int


@dataclass(frozen=True, slots=True)
class StateApplied:
    node: str
    seq: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Crashed:
    node: str
    role: Role = Role.PRIMARY


@dataclass(frozen=True, slots=True)
class BackupPlaced:
    node: str


Event = RequestArrived | OutputComputed | StateShipped | StateApplied | Crashed | BackupPlaced


@dataclass(frozen=True, slots=True)
class Compute:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class ReleaseOutput:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class ReleaseToClient:
    seq: int


@dataclass(frozen=True, slots=True)
class SendState:
    node: str
    seq: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ApplyState:
    node: str
    seq: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Promote:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class Rollback:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class Restore:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class Replay:
    node: str
    from_seq: int


@dataclass(frozen=True, slots=True)
class PlaceBackup:
    node: str


Command = (
    Compute
    | ReleaseOutput
    | ReleaseToClient
    | SendState
    | ApplyState
    | Promote
    | Rollback
    | Restore
    | Replay
    | PlaceBackup
)


class Topology:
    """The graph's shape as the protocols need it: order, neighbours, and stateful neighbourhoods.

    ``previous_stateful(n)``/``next_stateful(n)``: HAMS IV-A's previous and next stateful models, the
    nearest stateful models upstream and downstream of ``n`` (no stateful model between).
    """

    def __init__(self, graph: GraphParams) -> None:
        self.nodes = tuple(n.name for n in graph.nodes)
        self.stateful = frozenset(n.name for n in graph.nodes if n.stateful)
        self.inputs: dict[str, tuple[str, ...]] = {n: () for n in self.nodes}
        self.outputs: dict[str, tuple[str, ...]] = {n: () for n in self.nodes}
        for up, down in graph.edges:
            self.inputs[down] += (up,)
            self.outputs[up] += (down,)
        self.order = self._topological()
        self.sinks = tuple(n for n in self.order if not self.outputs[n])
        self.entries = tuple(n for n in self.order if not self.inputs[n])
        self._below = {n: self._reach(n, self.outputs) for n in self.nodes}
        self._above = {n: self._reach(n, self.inputs) for n in self.nodes}

    def downstream(self, node: str) -> frozenset[str]:
        """Every node ``node`` reaches, itself left out."""
        return self._below[node]

    def upstream(self, node: str) -> frozenset[str]:
        """Every node that reaches ``node``, itself left out."""
        return self._above[node]

    def previous_stateful(self, node: str) -> frozenset[str]:
        return self._nearest_stateful(node, self.inputs)

    def next_stateful(self, node: str) -> frozenset[str]:
        return self._nearest_stateful(node, self.outputs)

    def _nearest_stateful(self, node: str, step: dict[str, tuple[str, ...]]) -> frozenset[str]:
        found: set[str] = set()
        frontier = list(step[node])
        seen: set[str] = set()
        while frontier:
            n = frontier.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in self.stateful:
                found.add(n)
            else:
                frontier.extend(step[n])
        return frozenset(found)

    def _reach(self, node: str, step: dict[str, tuple[str, ...]]) -> frozenset[str]:
        seen: set[str] = set()
        frontier = list(step[node])
        while frontier:
            n = frontier.pop()
            if n not in seen:
                seen.add(n)
                frontier.extend(step[n])
        return frozenset(seen)

    def _topological(self) -> tuple[str, ...]:
        indegree = {n: len(self.inputs[n]) for n in self.nodes}
        ready = [n for n in self.nodes if indegree[n] == 0]
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for m in self.outputs[n]:
                indegree[m] -= 1
                if indegree[m] == 0:
                    ready.append(m)
        return tuple(order)


class ReplicationProtocol(ABC):
    """One service graph's replication: ``handle(event)`` returns the commands it calls for.

    Guarantee (checked by ``tests/policies/replication``): with one crash of any one node, primary
    or backup, under any interleaving of requests, computations and state transfers, the answers
    clients receive are those of *some* failure-free run of the graph (for the policies that claim
    it; ``none`` does not). Commands are meant to be carried out in the order given.
    """

    name: str = ""

    def __init__(self, graph: GraphParams) -> None:
        self.topology = Topology(graph)

    @abstractmethod
    def handle(self, event: Event) -> list[Command]:
        """What to do now that ``event`` happened."""

    def handle_all(self, events: Iterable[Event]) -> list[Command]:
        return [c for e in events for c in self.handle(e)]
