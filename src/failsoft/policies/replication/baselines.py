"""The baselines NSPB is measured against (HAMS sections I and III-B), on the same contract.

* :class:`NoReplication` (``none``): a crashed stateful model restarts from its initial state and
  goes on with the next request; what it had learned is lost, so its later answers differ from any
  failure-free run's.
* :class:`StopAndCopy` (``stop-and-copy``, Remus-style): a stateful model's output of request n is
  held until the state after n is applied at its backup; the primary computes on meanwhile. No
  output downstream ever reflects a state that could be lost, so a failover only promotes the backup
  and replays the failed model's inputs; the price is the copy's latency at every stateful hop.
* :class:`CheckpointReplay` (``checkpoint-replay``, Lineage-Stash-style): outputs go at once; every
  ``interval`` requests the state is checkpointed; a crashed model restores the last checkpoint and
  replays the inputs logged since. Consistent only when the model is deterministic: a replayed
  request of a non-deterministic model may give an output other than the one downstream already
  consumed (the paper's Figures 2-3), which the tests show with a concrete run.
"""

from __future__ import annotations

from failsoft.policies.replication.base import PrimaryBackup, StatefulNode
from failsoft.policies.replication.interface import Command, PlaceBackup, Promote, Restore
from failsoft.services import GraphParams


class NoReplication(PrimaryBackup):
    """No backups: a crashed stateful model starts over from its initial state."""

    name = "none"

    def _keeps_backups(self) -> bool:
        return False

    def _recover(self, node: str, rep: StatefulNode) -> list[Command]:
        return self._lose_state(node)


class StopAndCopy(PrimaryBackup):
    """Remus's primary-backup: an output is released once the state that produced it is durable."""

    name = "stop-and-copy"

    def _on_computed(self, node: str, seq: int) -> list[Command]:
        return []

    def _on_durable(self, node: str, seq: int) -> list[Command]:
        return self._release_held(node, seq)

    def _release_held(self, node: str, upto: int) -> list[Command]:
        commands: list[Command] = []
        for s in range(self.released[node] + 1, min(upto, self.computed[node]) + 1):
            commands += self._release(node, s)
        return commands

    def _recover(self, node: str, rep: StatefulNode) -> list[Command]:
        k = rep.backup_state()
        if not rep.has_backup or k is None:
            return self._lose_state(node)
        rep.reset(k, has_backup=False)
        rep.held = None
        rep.durable = max(rep.durable, k)
        commands: list[Command] = [Promote(node, k), PlaceBackup(node), *self._release_held(node, k)]
        return [*commands, self._restart(node, k)]


class CheckpointReplay(PrimaryBackup):
    """Periodic checkpoints and replay of the log since the last one; outputs are never held.

    ``interval`` is the number of requests between checkpoints (Lineage Stash's one per 100 requests,
    the HAMS paper's example, by default). The checkpoint store plays the backup's part in the
    contract (``SendState``/``ApplyState``), so the runtime ships a checkpoint like a state.
    """

    name = "checkpoint-replay"

    def __init__(self, graph: GraphParams, interval: int = 100) -> None:
        if interval < 1:
            raise ValueError(f"CheckpointReplay.interval must be >= 1; got {interval}")
        super().__init__(graph)
        self.interval = interval

    def _wants_ship(self, node: str, rep: StatefulNode) -> bool:
        return rep.shipped < 0 or self.computed[node] - rep.shipped >= self.interval

    def _recover(self, node: str, rep: StatefulNode) -> list[Command]:
        k = rep.backup_state()
        if not rep.has_backup or k is None:
            return self._lose_state(node)
        rep.reset(k, has_backup=True)
        rep.held = k
        return [Restore(node, k), self._restart(node, k)]
