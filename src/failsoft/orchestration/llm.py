"""LLM workers placed, watched and restarted by the core (LUMEN's recovery, decided once).

An ``llm`` service's workers are member apps of the service (:mod:`~failsoft.orchestration.llm_state`):
each has one placement, its memory counted on its server. The core decides everything about them,
and an executor (the runtime's ``LlmFleet``, the simulator's twin in :mod:`failsoft.sim.controller`)
carries out its commands (:class:`~failsoft.orchestration.commands.StartLlmWorker`, ...):

* **placement** (:meth:`LlmWorkers.place`): every worker on its home server, refused with a
  :class:`~failsoft.errors.CapacityError` naming the server, what is free and what is needed when the
  workers do not fit beside what the server holds; the standbys on theirs;
* **failure**: a worker is failed by the proof that its process is gone (:meth:`LlmWorkers.died`:
  the executor's probe found the actor dead, or the gateway saw it die under a request), or by the
  failure detector's verdict on its server (:meth:`LlmWorkers.servers_failed`, called where the core
  fails a server's apps): either way one failure, one ``llm-worker-failed`` event, one restart;
* **restart** (LUMEN 4.3): where a worker goes again is the first of: a standby with room for it (its
  own server's first: a standby has its imports done, so it starts fastest), its own server if that
  is up and has room (in place), its home server (the config's), the up server with the most free
  memory that fits. A standby used
  is replaced on its server. Under progressive recovery every standby holds the draft already
  (``StartLlmStandby.draft``; ``LlmGroup.standby_mb`` counted on its server), so a restart that
  adopts one drafts at once, and the restart serves the draft first: the
  executor reports phase ``draft`` (``llm-worker-draft``), the core answers with
  :class:`~failsoft.orchestration.commands.SwitchLlmTarget`, and phase ``serving`` ends the outage
  (``llm-worker-recovered``, with ``restart_ms`` from the failure). A start that fails is tried again
  after :data:`RETRY_S`, placed afresh; a report about another incarnation than the current (or the
  one being started) is stale and changes nothing;
* **standbys** are the core's (``LlmRecords.standbys``: the servers it counts one on); the executor
  reports one that died or did not start (:meth:`LlmWorkers.standby_lost`), and the core stops
  counting it and starts a replacement :data:`RETRY_S` later, so that its count and the executor's
  processes agree and a restart never expects a standby that is gone.
"""

from __future__ import annotations

import logging
from typing import Any

from failsoft.errors import CapacityError, UnknownNameError
from failsoft.orchestration.commands import (
    Emit,
    PublishLlm,
    StartLlmStandby,
    StartLlmWorker,
    StopLlmWorker,
    SwitchLlmTarget,
)
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.llm_state import LlmGroup, LlmPhase, LlmWorkerRecord

log = logging.getLogger(__name__)
RETRY_S = 1.0  # a failed start, or a worker with no room anywhere, is placed again this much later
RETRY_TIMER = "llm-retry"
STANDBY_TIMER = "llm-standby"  # a lost standby is replaced this timer's RETRY_S later


class LlmWorkers:
    """The core's part for ``llm`` services (see the module docstring); its state is
    ``ClusterState.llm``, its acts go through the one :class:`Effects`."""

    def __init__(self, effects: Effects) -> None:
        self.fx, self.state = effects, effects.state
        self.records = effects.state.llm
        self._ready: set[str] = set()

    # placement ------------------------------------------------------------------------------------
    def place(self, group: LlmGroup, now: float) -> None:
        """Start ``group``'s workers on their home servers and its standbys. Raises
        UnknownNameError for a server the cluster lacks and CapacityError when the workers do not
        fit, changing nothing. Placing a service again (a restarted controller) starts it afresh."""
        for server in (*group.homes, *group.standbys):
            if server not in self.state.servers:
                raise UnknownNameError(f"llm service {group.service!r}: no server {server!r}")
        old = {k: r for k, r in self.records.workers.items() if k[0] == group.service}
        for key in old:
            del self.records.workers[key]
        old_spares = self.records.standbys.pop(group.service, None)
        try:
            self._check_room(group)
        except CapacityError:
            self.records.workers.update(old)
            if old_spares is not None:
                self.records.standbys[group.service] = old_spares
            raise
        self.records.groups[group.service] = group
        self.records.standbys[group.service] = list(group.standbys)
        self._ready.discard(group.service)
        for worker, home in zip(group.workers, group.homes, strict=True):
            rec = LlmWorkerRecord(group.service, worker, home, group.memory_mb, pending=0, home=home)
            self.records.workers[(group.service, worker)] = rec
            self.fx.send(StartLlmWorker(group.service, worker, home, 0))
        for server in group.standbys:
            self.fx.send(StartLlmStandby(group.service, server, group.draft_first))
        self.fx.changes += 1
        self.fx.send(PublishLlm(group.service))

    def _check_room(self, group: LlmGroup) -> None:
        """Every server must hold its workers and its standbys (each standby the draft it
        preloads, ``standby_mb``) beside what it holds."""
        count: dict[str, list[int]] = {}
        for home in group.homes:
            count.setdefault(home, [0, 0])[0] += 1
        for server in group.standbys if group.standby_mb > 0 else ():
            count.setdefault(server, [0, 0])[1] += 1
        for server, (n, spares) in sorted(count.items()):
            capacity = self.state.servers[server].server.memory_mb
            free = capacity - self.state.used_mb(server) - self._homes_to_come(server)
            need = n * group.memory_mb + spares * group.standby_mb
            if need > free + 1e-9:
                raise CapacityError(
                    f"llm service {group.service!r}: server {server!r} has {free:.1f} MB free of "
                    f"{capacity:.1f} MB, but its {n} worker(s) and {spares} standby(s) need "
                    f"{need:.1f} MB ({group.memory_mb:.1f} MB each worker: weights and KV budget; "
                    f"{group.standby_mb:.1f} MB each standby: its draft)"
                )

    # inputs from the executor ------------------------------------------------------------------------
    def started(
        self, service: str, worker: str, incarnation: int, phase: str, info: dict[str, Any], now: float
    ) -> None:
        """The executor's process ``incarnation`` of ``worker`` serves its draft (``phase``
        ``draft``) or its target (``serving``)."""
        rec = self._record(service, worker)
        if rec.pending != incarnation:
            self.fx.send(StopLlmWorker(service, worker, incarnation))  # a start nobody waits for
            return
        rec.incarnation = incarnation
        group = self.records.groups[service]
        if LlmPhase(phase) is LlmPhase.DRAFT:
            rec.phase = LlmPhase.DRAFT
            self._emit("llm-worker-draft", rec, draft_ms=_ms(now - (rec.failed_at or now)))
            self.fx.send(SwitchLlmTarget(service, worker, incarnation))
        else:
            rec.phase, rec.pending = LlmPhase.SERVING, None
            if rec.failed_at is not None:
                self._emit(
                    "llm-worker-recovered",
                    rec,
                    restart_ms=_ms(now - rec.failed_at),
                    load_ms=info.get("load_ms"),
                    draft_first=group.draft_first,
                )
                rec.failed_at = None
            self._note_ready(service)
        self.fx.send(PublishLlm(service))

    def start_failed(self, service: str, worker: str, incarnation: int, error: str, now: float) -> None:
        """The start (or the switch to the target) of ``incarnation`` failed: placed again shortly."""
        rec = self._record(service, worker)
        if rec.pending != incarnation:
            return
        log.warning("llm worker %s/%s did not start on %s: %s", service, worker, rec.server, error)
        rec.phase, rec.pending = LlmPhase.FAILED, None
        rec.failed_at = now if rec.failed_at is None else rec.failed_at
        self.fx.send(StopLlmWorker(service, worker, incarnation))
        self.fx.wake_at(now + RETRY_S, (RETRY_TIMER, (service, worker)))
        self.fx.send(PublishLlm(service))

    def died(self, service: str, worker: str, incarnation: int, reason: str, now: float) -> bool:
        """Proof that ``worker``'s process ``incarnation`` is gone: failed and restarted now. False
        for a stale report (another incarnation, or a restart already under way)."""
        rec = self._record(service, worker)
        if rec.incarnation != incarnation or rec.phase in (LlmPhase.FAILED, LlmPhase.STARTING):
            return False
        self._fail(rec, reason, now)
        return True

    def servers_failed(self, failed: set[str], now: float) -> None:
        """The detector failed ``failed``: their workers fail with them and restart elsewhere; their
        standbys are gone and are started again on an up server. A worker still in its first start
        is judged by that start's outcome (a worker is a process of its own: a server whose agent
        was not heard from in time, at deployment, may run it well; a dead one fails its start)."""
        for rec in list(self.records.workers.values()):
            if rec.server in failed and rec.holds_memory and rec.phase is not LlmPhase.STARTING:
                self._fail(rec, f"server {rec.server} failed", now)
        for service, servers in self.records.standbys.items():
            lost = [s for s in servers if s in failed]
            for server in lost:
                servers.remove(server)
                spare = self._standby_server(service)
                if spare is not None:
                    servers.append(spare)
                    self.fx.send(StartLlmStandby(service, spare, self.records.groups[service].draft_first))

    def standby_lost(self, service: str, server: str, reason: str, now: float) -> None:
        """The executor found a standby of ``service`` on ``server`` dead (or it never started):
        the core stops counting it (its memory is free, a restart no longer expects it there) and
        starts a replacement :data:`RETRY_S` later (later, so that a server whose standbys keep
        dying does not get a start per probe). A standby the core no longer counts is ignored."""
        spares = self.records.standbys.get(service)
        if spares is None or server not in spares:
            return
        spares.remove(server)
        log.warning("llm standby of %s on %s lost: %s; replacing it", service, server, reason)
        self.fx.changes += 1
        self.fx.wake_at(now + RETRY_S, (STANDBY_TIMER, service))

    def replace_standby(self, service: str, now: float) -> None:
        """Start standbys until ``service`` has as many as it was placed with (the timer of
        :meth:`standby_lost`)."""
        group, spares = self.records.groups.get(service), self.records.standbys.get(service)
        while group is not None and spares is not None and len(spares) < len(group.standbys):
            server = self._standby_server(service)
            if server is None:
                return
            spares.append(server)
            self.fx.send(StartLlmStandby(service, server, group.draft_first))

    def retry(self, payload: tuple[str, str], now: float) -> None:
        """The retry timer of a worker whose start failed, or that found no room."""
        rec = self.records.workers.get(payload)
        if rec is not None and rec.phase is LlmPhase.FAILED and rec.pending is None:
            self._restart(rec, now)

    # decisions ----------------------------------------------------------------------------------------
    def _fail(self, rec: LlmWorkerRecord, reason: str, now: float) -> None:
        if rec.phase is not LlmPhase.FAILED:  # a restart that fails in turn is the same outage
            self._emit("llm-worker-failed", rec, reason=reason)
        self.fx.send(StopLlmWorker(rec.service, rec.worker, rec.incarnation))
        if rec.pending is not None and rec.pending != rec.incarnation:
            self.fx.send(StopLlmWorker(rec.service, rec.worker, rec.pending))
        rec.phase, rec.pending = LlmPhase.FAILED, None
        rec.failed_at = now if rec.failed_at is None else rec.failed_at
        self.fx.changes += 1  # its memory is free
        self._restart(rec, now)

    def _restart(self, rec: LlmWorkerRecord, now: float) -> None:
        group = self.records.groups[rec.service]
        where, standby = self._where(rec)
        if where is None:
            log.warning("llm worker %s/%s: no up server has room; trying again", rec.service, rec.worker)
            self.fx.wake_at(now + RETRY_S, (RETRY_TIMER, (rec.service, rec.worker)))
            self.fx.send(PublishLlm(rec.service))
            return
        if standby:
            spares = self.records.standbys[rec.service]
            spares.remove(where)
            spares.append(where)  # its replacement, on the same server (its draft counted again)
            self.fx.send(StartLlmStandby(rec.service, where, group.draft_first))
        rec.issued = max(rec.issued, rec.incarnation) + 1
        rec.server, rec.pending = where, rec.issued
        rec.restarts += 1
        self.fx.send(StartLlmWorker(rec.service, rec.worker, where, rec.pending, group.draft_first, standby))
        self.fx.send(PublishLlm(rec.service))

    def _where(self, rec: LlmWorkerRecord) -> tuple[str | None, bool]:
        """Where ``rec`` restarts, and whether a standby there adopts it (see the module docstring)."""
        room = {s: self._free(s) for s in self.state.servers if self.state.live(s)}
        fits = {s for s, free in room.items() if free + 1e-9 >= rec.memory_mb}
        spares = [s for s in self.records.standbys.get(rec.service, []) if s in fits]
        if spares:
            return min(spares, key=lambda s: (s != rec.server, -room[s], s)), True
        for server in (rec.server, rec.home):
            if server in fits:
                return server, False
        if fits:
            return min(fits, key=lambda s: (-room[s], s)), False
        return None, False

    def _homes_to_come(self, server: str) -> float:
        """Memory the apps at home on ``server`` will take that ``used_mb`` does not count yet (a
        deployment still loading them, a failover they will return from)."""
        counted = self.state.servers[server].holdings | self.state.needed_on(server)
        return sum(
            self.state.variant(name, rec.home.variant).memory_mb
            for name, rec in self.state.apps.items()
            if rec.home.server == server and (name, rec.home.variant) not in counted
        )

    def _free(self, server: str) -> float:
        return self.state.servers[server].server.memory_mb - self.state.used_mb(server)

    def _standby_server(self, service: str) -> str | None:
        """An up server for a replacement standby: the group's servers first, fewest standbys."""
        group = self.records.groups[service]
        mine = [s for s in dict.fromkeys((*group.standbys, *group.homes)) if self.state.live(s)]
        up = mine or [s for s in self.state.servers if self.state.live(s)]
        if not up:
            return None
        spares = self.records.standbys[service]
        return min(up, key=lambda s: (spares.count(s), up.index(s)))

    # helpers ------------------------------------------------------------------------------------------
    def _record(self, service: str, worker: str) -> LlmWorkerRecord:
        rec = self.records.workers.get((service, worker))
        if rec is None:
            known = ", ".join(f"{s}/{w}" for s, w in self.records.workers) or "none"
            raise UnknownNameError(f"no llm worker {service}/{worker} (workers: {known})")
        return rec

    def _note_ready(self, service: str) -> None:
        if service in self._ready:
            return
        workers = self.records.of(service)
        if all(r.phase is LlmPhase.SERVING for r in workers):
            self._ready.add(service)
            self.fx.send(
                Emit("llm-service-ready", {"service": service, "workers": [r.worker for r in workers]})
            )

    def _emit(self, event: str, rec: LlmWorkerRecord, **extra: Any) -> None:
        self.fx.send(
            Emit(event, {"service": rec.service, "worker": rec.worker, "server": rec.server, **extra})
        )

    def ready(self, service: str) -> bool:
        """Whether every worker of ``service`` has served (once set, it stays: restarts are outages)."""
        return service in self._ready


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


__all__ = ["RETRY_S", "RETRY_TIMER", "STANDBY_TIMER", "LlmWorkers"]
