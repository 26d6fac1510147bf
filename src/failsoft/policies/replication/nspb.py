"""NSPB, HAMS's non-stop primary-backup (sections III-B, IV-B and IV-C), over a whole service graph.

The central idea: a stateful model's primary releases the output of request n at once and ships the
state n left behind *while* it computes n+1, so no output waits for a copy (Remus's stop-and-buffer,
:class:`~failsoft.policies.replication.baselines.StopAndCopy`, waits at every stateful model of the
path). What keeps this consistent when models are non-deterministic (a re-run of request n on a GPU
may give another output) is *when a backup may apply a state*:

* **causal durability** (IV-C; the public code's ``BackNotifyDurable``): the backup of model q
  applies q's state after request j only once every *previous stateful model* p of q has a durable
  state after j or later. So a durable state of q never reflects an output of p that p's backup
  could not reproduce: durable states along the graph always form a consistent cut.
* **a failed primary** (derived; the excerpt stops before IV-E): its backup is promoted with its
  durable state k; every stateful model downstream is rolled back to its own backup's state (which,
  by the rule above, reflects no output of the failed primary after k); every node at or below them
  replays, from the gateway's edge logs, the requests after the earliest of those states. Outputs
  the dead primary released after k may have been consumed downstream; the rollback erases them.
* **answers to clients** (derived, HAMS's frontend): a request is answered once every stateful model
  has a durable state after it. Internal outputs travel at once; only the last hop to the client
  waits for the newest state to land, so an answer is never contradicted by a later rollback.

A backup's own failure stops nothing: the primary goes on and ships its newest state to a new backup;
until that backup applies it, the model's durable state (and with it the answers of later requests
and the durable states of the models downstream) does not advance. The docstrings of
:class:`~failsoft.policies.replication.base.PrimaryBackup` and ``docs/hams.md`` give the rest.
"""

from __future__ import annotations

from failsoft.policies.replication.base import PrimaryBackup, StatefulNode
from failsoft.policies.replication.interface import Command, PlaceBackup, Promote, Restore, Rollback


class Nspb(PrimaryBackup):
    """Non-stop primary-backup: release at once, ship in parallel, apply in causal order."""

    name = "nspb"

    def _may_apply(self, node: str, seq: int) -> bool:
        return all(self.replicas[p].durable >= seq for p in self.topology.previous_stateful(node))

    def _client_may_see(self, seq: int) -> bool:
        return all(rep.durable >= seq for rep in self.replicas.values())

    def _recover(self, node: str, rep: StatefulNode) -> list[Command]:
        k = rep.backup_state()
        if not rep.has_backup or k is None:  # both copies gone: outside the failure model
            return self._lose_state(node)
        rep.reset(k, has_backup=False)
        rep.held = None
        rep.durable = max(rep.durable, k)
        commands: list[Command] = [Promote(node, k), PlaceBackup(node)]
        restart = {node: k}
        for below in self.topology.order:
            if below not in self.replicas or below not in self.topology.downstream(node):
                continue
            down = self.replicas[below]
            j = down.backup_state()
            if j is None:  # its backup is new and holds nothing yet: it can only start over
                down.reset(0, has_backup=down.has_backup)
                commands.append(Restore(below, 0))
                restart[below] = 0
                continue
            down.reset(j, has_backup=down.has_backup)
            down.held, down.durable = j, max(down.durable, j)  # an apply under way ends at j
            commands.append(Rollback(below, j))
            restart[below] = j
        return commands + self._replay(restart)
