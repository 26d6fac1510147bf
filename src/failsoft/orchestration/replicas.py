"""Replicas: an app served by several servers at once, their number fixed or autoscaled.

A replica is a warm backup that serves. The core keeps an app's replicas besides its route as
*pinned* copies owned by :data:`~failsoft.orchestration.state.REPLICA_OWNER`
(:class:`~failsoft.domain.WarmBackup` with ``pinned=True`` in :class:`ClusterState`), so that
everything a mechanism's copy gets, a replica gets too:

* its load is a :class:`~failsoft.orchestration.commands.Load` at the warm backups' priority, in the
  server's load slots, ended by ``load_done``;
* the capacity views count it: warm-backup re-planning (FailLite's proactive ILP) takes it off its
  server before placing any backup (**replicas first, then warm backups with what is left**), and
  the failover policies see it as a live copy;
* the routing table publishes it (``replicas.serving`` beside the route), the store keeps it, garbage
  collection leaves it;
* when its server fails it is dropped with it, and **replaced**: the next step places another
  replica where there is room. When the *route's* server fails, the app switches to a replica at
  once (a warm switch, before any plan), and a new replica is placed in its stead.

How many replicas an app wants (its route included) is ``ClusterState.scale``: the config's
``replicas``, or, for an app with ``autoscaling``, what its :class:`~failsoft.policies.autoscale.Autoscaler`
decides from the ongoing requests the driver reports (:meth:`Replicas.observe`). A change is a
``scale`` event. Placement (:meth:`Replicas.place`) is worst-fit on what the core counts: an up
server that does not serve the app yet and has the memory (what it holds, keeps and is loading)
and the compute (``rate_rps`` times latency, per serving copy) for one more; a warm backup of the
app's variant already loaded there is turned into the replica instead of loading another.
When no server has room, warm backups (not pinned) are released to make it, on the server that
needs the fewest released: a replica serves, a backup waits for a failure, and the backups are
re-planned afterwards in what is left. Scaling down drops replicas (loading ones first); a loaded
one is published as *draining* (``ClusterState.draining``) until the drain period ends, so that the
gateway sends it nothing new but lets it finish what it holds, then it is unloaded; scaling out
again meanwhile takes a draining replica back without a load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from failsoft.domain import BackupState, WarmBackup
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.loads import Priority
from failsoft.orchestration.state import REPLICA_OWNER, WarmRecord
from failsoft.policies.autoscale import Autoscaler

log = logging.getLogger(__name__)
RETRY_S = 1.0  # a replica whose load failed is tried again this much later


class Replicas:
    """The replicas of the :class:`~failsoft.orchestration.core.Orchestrator`; see the module
    docstring. Its state: the apps' autoscalers, and back-offs of replicas that would not load."""

    def __init__(self, effects: Effects, drain_s: float, backups_released: Callable[[], None]) -> None:
        self.fx, self.state, self.drain_s = effects, effects.state, drain_s
        self.backups_released = backups_released
        self.scalers = {
            name: Autoscaler(rec.app.autoscaling)
            for name, rec in self.state.apps.items()
            if rec.app.autoscaling is not None
        }
        self.watched: set[str] = set()  # apps that have or want replicas: the only ones reconciled
        self.rewatch()
        self._stuck: dict[str, int] = {}  # app -> fx.changes when no server had room for a replica
        self._retry_at: dict[str, float] = {}  # app -> when a failed replica load may be tried again

    def rewatch(self) -> None:
        """Find the apps that have or want replicas again (after the state was read back)."""
        self.watched = {a for a, n in self.state.scale.items() if n > 1} | set(self.scalers)
        self.watched |= {w.backup.app for w in self.state.warm.values() if w.owner == REPLICA_OWNER}

    # inputs -------------------------------------------------------------------------------------
    def observe(self, app: str, ongoing: float, now: float) -> None:
        """``app`` has ``ongoing`` requests in flight (queued or running) across its replicas."""
        scaler = self.scalers.get(app)
        if scaler is None:
            return
        scaler.observe(now, ongoing)
        current = self.state.scale[app]
        wanted = scaler.decide(now, current)
        if wanted != current:
            self.scale(app, wanted, reason="autoscale", ongoing=round(scaler.average(), 3))

    def scale(self, app: str, replicas: int, reason: str, **extra: object) -> None:
        """Have ``replicas`` serve ``app`` (its route included); a ``scale`` event says so."""
        previous = self.state.scale[app]
        if replicas == previous:
            return
        self.state.scale[app] = replicas
        self.watched.add(app)
        self._stuck.pop(app, None)
        self.fx.emit("scale", app, None, replicas=replicas, previous=previous, reason=reason, **extra)
        self.fx.publish(force=True)

    def loaded(self, ok: bool, app: str, now: float) -> None:
        """A replica's load ended; a failed one is tried again after :data:`RETRY_S`."""
        if not ok:
            self._retry_at[app] = now + RETRY_S
            self.fx.wake_at(now + RETRY_S)

    @property
    def loading(self) -> bool:
        """Whether a replica is loading (a deployment is ready once they serve)."""
        return any(
            w.owner == REPLICA_OWNER and w.state is BackupState.LOADING for w in self.state.warm.values()
        )

    # the step -----------------------------------------------------------------------------------
    def reconcile(self, now: float, busy: Callable[[str], bool]) -> None:
        """Bring every routed app not ``busy`` (an operation or a plan under way) to its count."""
        for name in sorted(self.watched):
            wanted = self.state.scale[name]
            have = self.state.replicas_of(name)
            if wanted <= 1 and not have:
                continue
            rec = self.state.apps[name]
            if rec.route is None or busy(name):
                continue
            extra = len(have) - (wanted - 1)
            if extra > 0:
                self._drop(name, have, extra, now)
            elif extra < 0 and self._may_place(name, now):
                for _ in range(-extra):
                    if self.place(name) is None:
                        self._stuck[name] = self.fx.changes
                        log.warning("no server has room for another replica of %s", name)
                        break

    def _may_place(self, app: str, now: float) -> bool:
        if self._stuck.get(app) == self.fx.changes:
            return False  # nothing freed since no server had room
        return now >= self._retry_at.get(app, now)

    def place(self, app: str) -> str | None:
        """Add one replica of ``app`` (its home variant); the server (None: no server has room)."""
        rec = self.state.apps[app]
        variant = rec.home.variant
        taken = {p.server for p in (rec.route, rec.home, rec.final) if p is not None}
        candidates = []
        for name, srv in self.state.servers.items():
            if srv.state is None or not srv.live or name in taken:
                continue
            backup = self.state.warm.get((app, name))
            if backup is not None and backup.backup.pinned:
                continue  # a replica already, or a mechanism's copy
            warm = (variant, BackupState.WARM)
            loaded = backup is not None and (backup.backup.variant, backup.state) == warm
            if loaded or self.state.draining.get((app, name)) == variant:
                candidates.append((0, 0.0, name))  # a loaded backup or a draining replica serves at once
            elif self._fits(app, variant, name):
                free = srv.server.memory_mb - self.state.used_mb(name)
                candidates.append((1, -free, name))
        if not candidates:
            return self._place_by_releasing(app, variant, taken)
        _, _, server = min(candidates)
        old = self.state.warm.get((app, server))
        record = WarmRecord(WarmBackup(app, variant, server, pinned=True), BackupState.LOADING, REPLICA_OWNER)
        self.state.warm[(app, server)] = record
        if old is not None or self.state.draining.pop((app, server), None) == variant:
            record.state = BackupState.WARM  # the backup, or the replica that was draining, serves on
        else:
            self.fx.load(app, server, variant, Priority.WARM, pinned=True)
        self.fx.publish(force=True)
        return server

    def _place_by_releasing(self, app: str, variant: str, taken: set[str]) -> str | None:
        """Release warm backups (not pinned) where the fewest make room; the server (None: none)."""
        options = []
        for name, srv in self.state.servers.items():
            if srv.state is None or not srv.live or name in taken or (app, name) in self.state.warm:
                continue
            release = self._release_for(app, variant, name)
            if release is not None:
                options.append((len(release), name, release))
        if not options:
            return None
        _, server, release = min(options, key=lambda o: (o[0], o[1]))
        for w in release:
            b = w.backup
            del self.state.warm[(b.app, b.server)]
            log.info("warm backup of %s on %s released for a replica of %s", b.app, server, app)
            if not self.fx.needed(b.app, b.server, b.variant):
                self.fx.unload(b.server, b.app, b.variant)
        self.backups_released()
        return self.place(app)

    def _release_for(self, app: str, variant: str, server: str) -> list[WarmRecord] | None:
        """The fewest warm backups on ``server`` whose release lets a replica fit (None: none do)."""
        backups = sorted(
            (w for (_, s), w in self.state.warm.items() if s == server and not w.backup.pinned),
            key=lambda w: (-self.state.variant(w.backup.app, w.backup.variant).memory_mb, w.backup.app),
        )
        srv = self.state.servers[server].server
        demand = self.state.variant(app, variant).demand(self.state.apps[app].app.rate_rps)
        if self._compute_on(server) + demand.compute > srv.compute + 1e-9:
            return None
        free = srv.memory_mb - self.state.used_mb(server) - self._loading_mb(server)
        release: list[WarmRecord] = []
        for w in backups:
            if free >= demand.memory_mb - 1e-9:
                break
            release.append(w)
            free += self.state.variant(w.backup.app, w.backup.variant).memory_mb
        return release if release and free >= demand.memory_mb - 1e-9 else None

    def _loading_mb(self, server: str) -> float:
        return sum(
            self.state.variant(j.app, j.variant).memory_mb
            for j in self.fx.jobs.values()
            if j.server == server and (j.app, j.variant) not in self.state.needed_on(server)
        )

    def _fits(self, app: str, variant: str, server: str) -> bool:
        """Memory and compute for one more copy of ``app`` on ``server``, as the core counts them."""
        srv = self.state.servers[server].server
        demand = self.state.variant(app, variant).demand(self.state.apps[app].app.rate_rps)
        memory = self.state.used_mb(server) + self._loading_mb(server) + demand.memory_mb
        return (
            memory <= srv.memory_mb + 1e-9 and self._compute_on(server) + demand.compute <= srv.compute + 1e-9
        )

    def _compute_on(self, server: str) -> float:
        """Compute the copies that serve on ``server`` take: routes, upgrade targets, pinned copies."""
        used = 0.0
        for name, rec in self.state.apps.items():
            for p in {rec.route, rec.final}:
                if p is not None and p.server == server:
                    used += self.state.variant(name, p.variant).demand(rec.app.rate_rps).compute
        for (app, where), w in self.state.warm.items():
            if where == server and w.backup.pinned:
                rate = self.state.apps[app].app.rate_rps
                used += self.state.variant(app, w.backup.variant).demand(rate).compute
        return used

    def _drop(self, app: str, have: list[WarmRecord], count: int, now: float) -> None:
        """Drop ``count`` replicas of ``app``: loading ones first, then the last by server name;
        a loaded one is unloaded after the drain period (its requests in flight finish)."""
        order = sorted(have, key=lambda w: (w.state is BackupState.WARM, w.backup.server))
        for w in order[:count]:
            del self.state.warm[(app, w.backup.server)]
            if w.state is BackupState.WARM:
                self.state.draining[(app, w.backup.server)] = w.backup.variant
                self.fx.wake_at(now + self.drain_s, ("drain", (app, w.backup.server, w.backup.variant)))
        self.fx.changes += 1
        self.fx.publish(force=True)
