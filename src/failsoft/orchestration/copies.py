"""Mechanism copies: a model copy a mechanism asks the core for, planned and counted like any other.

FailLite's core places every app's route and its warm backups. Two mechanisms need copies of their
own besides: Jellyfish serves a worker's clients on another *rung* of the variant ladder, a copy of
the worker's app in another variant on the route's server; HAMS keeps a stateful node's *backup*,
a copy on another server that the node's state is shipped to. Such a copy is *pinned*: a
:class:`~failsoft.domain.WarmBackup` with ``pinned=True`` in the :class:`ClusterState`, so that

* its load is a :class:`~failsoft.orchestration.commands.Load` at a priority, in the server's load
  slots like every load, and reported back by ``load_done``;
* the capacity views count it (warm-backup re-planning takes it off its server, the failover
  policies see it), the store keeps it, and garbage collection leaves it;
* the routing table publishes it (``pinned`` beside each app's route: server, variant, owner, and
  ``ready`` once loaded), which is how the mechanism learns its copy serves;
* a failed server's pinned copies are dropped with it (and the table says so), and a failover may
  switch an app to its pinned copy: the route then has kind ``promoted`` and stays there (the copy
  holds what the home does not: HAMS's state).

The inputs are :meth:`MechanismCopies.pin` (on a named server, or :meth:`~MechanismCopies.place`
where the core's capacity view finds room) and :meth:`~MechanismCopies.unpin`; the runtime's
controller exposes them to the gateway's dispatchers, which never load or unload a model themselves.
A copy is keyed like every backup by (app, server): pinning another variant there *replaces* the
copy, and the variant it replaces is unloaded only once the new one is warm (make before break).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from failsoft.domain import BackupState, WarmBackup
from failsoft.errors import CapacityError, UnknownNameError
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.state import WarmRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CopyRequest:
    """A mechanism asks for a copy of ``app`` in ``variant`` for ``owner`` (``slo:<service>``,
    ``graph:<service>``): on ``server``, or (None) on the up server with the most free memory outside
    ``avoid`` and the sites in ``avoid_sites``; loaded at ``priority``. The gateway sends it to the
    controller as it is."""

    app: str
    variant: str
    owner: str
    server: str | None = None
    priority: Priority = Priority.WARM
    avoid: tuple[str, ...] = ()
    avoid_sites: tuple[str, ...] = ()


class MechanismCopies:
    """The pinned copies of the :class:`~failsoft.orchestration.core.Orchestrator`; see the module
    docstring. It keeps no state of its own: the copies are ``ClusterState.warm`` records."""

    def __init__(self, effects: Effects, drain_s: float) -> None:
        self.fx, self.state, self.drain_s = effects, effects.state, drain_s

    def pin(self, request: CopyRequest, now: float) -> str:
        """Load the copy and keep it until unpinned; the server it is on.

        Raises UnknownNameError for an unknown app, variant or server, CapacityError when the server
        is not up or has no room for it (the core's view: what it holds, keeps and is loading), or
        when no server outside ``avoid`` has."""
        r = request
        server = r.server if r.server is not None else self._place(r)
        self._pin(r.app, r.variant, server, r.owner, r.priority)
        return server

    def _pin(self, app: str, variant: str, server: str, owner: str, priority: Priority) -> None:
        self._check(app, variant, server)
        if not self.state.live(server):
            raise CapacityError(f"server {server!r} is not up: no copy of {app!r} can be pinned there")
        rec = self.state.warm.get((app, server))
        if rec is not None and rec.backup.variant == variant:
            rec.backup = WarmBackup(app, variant, server, pinned=True)
            rec.owner = owner
            self.fx.publish(force=True)
            return  # already there (or loading): pinned as it is
        if not self.fits(app, variant, server):
            raise CapacityError(f"server {server!r} has no room for {app}/{variant}")
        previous = None
        if rec is not None:
            previous = rec.backup.variant if rec.state is BackupState.WARM else rec.previous
        self.state.warm[(app, server)] = WarmRecord(
            WarmBackup(app, variant, server, pinned=True), BackupState.LOADING, owner, previous
        )
        self.fx.load(app, server, variant, priority, pinned=True)
        self.fx.publish(force=True)

    def _place(self, r: CopyRequest) -> str:
        """The up server with the most free memory that fits, not in ``avoid`` nor at a site in
        ``avoid_sites`` (CapacityError when none has room)."""
        app, variant, avoid, avoid_sites = r.app, r.variant, r.avoid, r.avoid_sites
        self._check(app, variant, None)
        up = [
            rec.server
            for name, rec in self.state.servers.items()
            if rec.live and name not in avoid and rec.server.site not in avoid_sites
        ]
        fit = [s for s in up if self.fits(app, variant, s.name)]
        room = {s.name: s.memory_mb - self.state.used_mb(s.name) for s in fit}
        if not room:
            raise CapacityError(
                f"no up server outside {sorted(avoid)} (sites {sorted(avoid_sites)}) "
                f"has room for {app}/{variant}"
            )
        return min(room, key=lambda s: (-room[s], s))

    def unpin(self, app: str, server: str, owner: str, now: float) -> bool:
        """Give the copy up: unloaded after the drain period unless a route needs it. False when no
        pinned copy of ``app`` is on ``server`` (gone with its server, or taken over by a failover)."""
        rec = self.state.warm.get((app, server))
        if rec is None or not rec.backup.pinned:
            return False
        if rec.owner not in (None, owner):
            log.warning("%s asked to unpin %s on %s, pinned by %s: refused", owner, app, server, rec.owner)
            return False
        del self.state.warm[(app, server)]
        for variant in (rec.backup.variant, rec.previous):
            if variant is not None and (rec.state is BackupState.WARM or variant == rec.previous):
                self.fx.wake_at(now + self.drain_s, ("drain", (app, server, variant)))
        self.fx.changes += 1
        self.fx.publish(force=True)
        return True  # a copy still loading is unloaded when its load ends (no record wants it)

    def loaded(self, ok: bool, app: str, server: str, variant: str, now: float) -> None:
        """A pinned copy's load ended: warm (the variant it replaces drains), or given up."""
        rec = self.state.warm.get((app, server))
        if rec is not None and rec.backup.variant == variant and rec.state is BackupState.LOADING:
            if ok:
                rec.state = BackupState.WARM
                if rec.previous is not None:
                    self.fx.wake_at(now + self.drain_s, ("drain", (app, server, rec.previous)))
                    rec.previous = None
            elif rec.previous is not None:  # the copy it was to replace serves on
                rec.backup = WarmBackup(app, rec.previous, server, pinned=True)
                rec.state, rec.previous = BackupState.WARM, None
            else:
                del self.state.warm[(app, server)]
            self.fx.publish(force=True)
        elif ok and not self.fx.needed(app, server, variant):
            self.fx.unload(server, app, variant)  # unpinned or replaced while it loaded

    def fits(self, app: str, variant: str, server: str) -> bool:
        memory = self.state.variant(app, variant).memory_mb
        loading = sum(
            self.state.variant(j.app, j.variant).memory_mb
            for j in self.fx.jobs.values()
            if j.server == server and (j.app, j.variant) not in self.state.needed_on(server)
        )
        used = self.state.used_mb(server) + loading
        return used + memory <= self.state.servers[server].server.memory_mb + 1e-9

    def _check(self, app: str, variant: str, server: str | None) -> None:
        if app not in self.state.apps:
            raise UnknownNameError(f"no app {app!r} to pin a copy of")
        family = self.state.families[self.state.apps[app].app.family]
        if variant not in {v.name for v in family.variants}:
            raise UnknownNameError(f"app {app!r} (family {family.name!r}) has no variant {variant!r}")
        if server is not None and server not in self.state.servers:
            raise UnknownNameError(f"no server {server!r} to pin {app!r} on")
