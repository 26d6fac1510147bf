"""The bookkeeping every replication policy shares, and the hooks where they differ.

:class:`PrimaryBackup` follows each node's progress (``computed``: the last request its primary
computed, ``released``: the last whose output went downstream) and each stateful node's replication
(:class:`StatefulNode`: the state in flight, the states its backup buffered, the state its backup
holds). A policy says, through four hooks, when an output is released (``_on_computed``), when a
state is shipped (``_wants_ship``), when a buffered state may be applied (``_may_apply``), when a
client is answered (``_client_may_see``), and how a crashed primary comes back (``_recover``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from failsoft.policies.replication.interface import (
    ApplyState,
    BackupPlaced,
    Command,
    Compute,
    Crashed,
    Event,
    OutputComputed,
    PlaceBackup,
    ReleaseOutput,
    ReleaseToClient,
    Replay,
    ReplicationProtocol,
    RequestArrived,
    Restore,
    Role,
    SendState,
    StateApplied,
    StateShipped,
)
from failsoft.services import GraphParams


@dataclass
class StatefulNode:
    """Replication of one stateful node (mutable: the protocol's own memory, never shared).

    ``held``: the state after which request the backup (or checkpoint store) holds, None when it
    holds none (a new backup before its first state). ``durable`` never goes back: the highest state
    a backup of this node applied (HAMS IV-A: a state is durable once the backup applied it).
    """

    epoch: int = 0
    has_backup: bool = True
    held: int | None = 0
    durable: int = 0
    shipped: int = 0
    in_flight: bool = False
    applying: int | None = None
    buffered: set[int] = field(default_factory=set)

    def backup_state(self) -> int | None:
        """The state the backup has, or will have once the apply it is doing ends (applies are atomic)."""
        return self.applying if self.applying is not None else self.held

    def reset(self, seq: int, *, has_backup: bool) -> None:
        """A role change: a new epoch (older transfers are stale), nothing buffered or in flight."""
        self.epoch += 1
        self.has_backup = has_backup
        self.shipped = seq
        self.in_flight = False
        self.applying = None
        self.buffered.clear()


class PrimaryBackup(ReplicationProtocol):
    """Shared event handling; subclasses set the policy through the hooks below."""

    def __init__(self, graph: GraphParams) -> None:
        super().__init__(graph)
        self.computed = dict.fromkeys(self.topology.nodes, 0)
        self.released = dict.fromkeys(self.topology.nodes, 0)
        self.replicas = {n: StatefulNode(has_backup=self._keeps_backups()) for n in self.topology.stateful}
        self.answered = 0

    # -- hooks -----------------------------------------------------------------------------------

    def _keeps_backups(self) -> bool:
        return True

    def _on_computed(self, node: str, seq: int) -> list[Command]:
        """A stateful node computed ``seq``: release its output now (the default) or later."""
        return self._release(node, seq)

    def _wants_ship(self, node: str, rep: StatefulNode) -> bool:
        """Ship the newest state now? (the default: whenever one is newer than the last shipped)."""
        return self.computed[node] > rep.shipped

    def _may_apply(self, node: str, seq: int) -> bool:
        return True

    def _on_durable(self, node: str, seq: int) -> list[Command]:
        return []

    def _client_may_see(self, seq: int) -> bool:
        return True

    def _recover(self, node: str, rep: StatefulNode) -> list[Command]:
        """The primary of stateful ``node`` died: bring the node back."""
        raise NotImplementedError

    # -- events ----------------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Command]:
        match event:
            case RequestArrived(node, seq):
                return [Compute(node, seq)]
            case OutputComputed(node, seq):
                self.computed[node] = seq
                if node not in self.replicas:
                    return self._release(node, seq) + self._answer()
                return self._on_computed(node, seq) + self._ship(node) + self._answer()
            case StateShipped(node, seq, epoch):
                rep = self.replicas[node]
                if epoch != rep.epoch:
                    return []
                rep.in_flight = False
                rep.buffered.add(seq)
                return self._ship(node) + self._apply(node)
            case StateApplied(node, seq, epoch):
                return self._applied(node, seq, epoch)
            case Crashed(node, role):
                return self._crashed(node, role)
            case BackupPlaced(node):
                rep = self.replicas[node]
                rep.reset(-1, has_backup=True)
                rep.held = None
                return self._ship(node)
        raise TypeError(f"not a replication event: {event!r}")

    def _applied(self, node: str, seq: int, epoch: int) -> list[Command]:
        rep = self.replicas[node]
        if epoch != rep.epoch:
            return []
        rep.applying = None
        rep.held = seq
        rep.durable = max(rep.durable, seq)
        commands = self._on_durable(node, seq) + self._apply(node)
        for nxt in sorted(self.topology.next_stateful(node)):
            commands += self._apply(nxt)
        return commands + self._answer()

    def _crashed(self, node: str, role: Role) -> list[Command]:
        if node not in self.replicas:  # a stateless node restarts and is given its inputs again
            return [Restore(node, 0), self._restart(node, self.computed[node])]
        rep = self.replicas[node]
        if role is Role.BACKUP:
            if not rep.has_backup:
                return []
            rep.reset(rep.shipped, has_backup=False)
            rep.held = None
            return [PlaceBackup(node)]
        return self._recover(node, rep)

    # -- helpers ---------------------------------------------------------------------------------

    def _release(self, node: str, seq: int) -> list[Command]:
        self.released[node] = seq
        return [ReleaseOutput(node, seq)]

    def _ship(self, node: str) -> list[Command]:
        rep = self.replicas[node]
        if not rep.has_backup or rep.in_flight or not self._wants_ship(node, rep):
            return []
        rep.in_flight = True
        rep.shipped = self.computed[node]
        return [SendState(node, rep.shipped, rep.epoch)]

    def _apply(self, node: str) -> list[Command]:
        """Apply the newest buffered state that may be applied, if the backup is not applying one."""
        rep = self.replicas[node]
        if rep.applying is not None:
            return []
        ready = [s for s in rep.buffered if self._may_apply(node, s)]
        if not ready:
            return []
        seq = max(ready)
        rep.buffered = {s for s in rep.buffered if s > seq}
        rep.applying = seq
        return [ApplyState(node, seq, rep.epoch)]

    def _answer(self) -> list[Command]:
        """Answer clients, in request order, as far as the sinks' outputs and the policy allow."""
        commands: list[Command] = []
        while True:
            seq = self.answered + 1
            if any(self.released[s] < seq for s in self.topology.sinks) or not self._client_may_see(seq):
                return commands
            self.answered = seq
            commands.append(ReleaseToClient(seq))

    def _lose_state(self, node: str) -> list[Command]:
        """A fresh primary with the initial state goes on from the next request: the state is lost."""
        return [Restore(node, 0), self._restart(node, self.computed[node])]

    def _restart(self, node: str, last: int) -> Replay:
        """``node`` alone starts over after request ``last``: its later outputs are computed again."""
        self.computed[node] = last
        self.released[node] = min(self.released[node], last)
        return Replay(node, last + 1)

    def _replay(self, restart_at: dict[str, int]) -> list[Command]:
        """Replay every node at or below the restarted ones, each from its earliest invalid request.

        ``restart_at`` maps each restarted node to the last request its new state includes; a node
        downstream of several restarts from the earliest of theirs.
        """
        commands: list[Command] = []
        for node in self.topology.order:
            above = [s for n, s in restart_at.items() if n == node or n in self.topology.upstream(node)]
            if not above:
                continue
            last = min(above)
            if last >= self.computed[node]:
                last = self.computed[node]  # nothing of it is invalid; deliver what it misses
            self.computed[node] = last
            self.released[node] = min(self.released[node], last)
            commands.append(Replay(node, last + 1))
        return commands
