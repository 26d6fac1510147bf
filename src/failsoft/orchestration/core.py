"""The orchestration core: every decision between "a server went silent" and "every app is served".

FailLite's controller (3.4, 4) detects failures, plans, then carries the plan out: warm switches,
progressive loads, upgrades, returns home, warm backups re-planned. In failsoft that *carrying out*
is written once, here, with no I/O at all (sans-I/O, like h11 or vLLM's scheduler): the core takes
inputs (heartbeats, health checks, finished loads, finished plans, inspection reports, the passing
of time) and returns :mod:`~failsoft.orchestration.commands` for its driver to carry out. Two
drivers exist:

* the runtime's (:mod:`failsoft.runtime.core_driver`): asyncio on the controller actor, Ray calls
  to the agents, the policies run inline or in a planner process;
* the simulator's (:mod:`failsoft.sim.controller`): SimPy processes, loads that take their profiled
  time, plans computed at once.

So the simulator twins the runtime by construction: the same load priorities and slots, the same
per-server upgrade turn, the same rule for when upgrades start (once every app of the failover is
served), the same wait for suspect servers (a site failure is planned as one), the same back-off.

Inputs and their order. The driver calls :meth:`Orchestrator.heartbeat` as heartbeats arrive,
:meth:`~Orchestrator.check_health` every few milliseconds (the detector's verdicts), and the other
inputs as their commands complete. Each input returns the commands it caused and runs the core's
step (timers that are due, failures waiting to be planned, reconciliation), so a driver needs no
other loop than "feed inputs, run commands, wake up at :meth:`~Orchestrator.next_wakeup`".
"""

from __future__ import annotations

import dataclasses
import logging
from enum import StrEnum
from typing import Any

from failsoft.domain import (
    ActionKind,
    BackupState,
    FailoverAction,
    FailoverPlan,
    Placement,
    ProactivePlan,
    Scenario,
    ServerState,
)
from failsoft.errors import UnknownNameError
from failsoft.orchestration.commands import (
    Command,
    Emit,
    Inspect,
    InspectPurpose,
    PlanFailover,
    Planned,
)
from failsoft.orchestration.copies import CopyRequest, MechanismCopies
from failsoft.orchestration.deploy import DeployPlan, Desired, Running, apply_plan, plan_deploy
from failsoft.orchestration.deploy_run import Deploys
from failsoft.orchestration.effects import Effects
from failsoft.orchestration.llm import RETRY_TIMER, STANDBY_TIMER, LlmWorkers
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.orchestration.operations import Group, Operations
from failsoft.orchestration.replicas import Replicas
from failsoft.orchestration.settings import OrchestrationSettings
from failsoft.orchestration.state import REPLICA_OWNER, ClusterState, RouteKind
from failsoft.orchestration.warm import WarmBackups
from failsoft.policies.detection import HealthChange, HeartbeatDetector
from failsoft.policies.failover.common import affected_apps, initial_ledger, warm_switches
from failsoft.policies.failover.ledger import Ledger
from failsoft.services import ServiceMode

log = logging.getLogger(__name__)
LONG_AGO_S = 3600.0
# the cause a failure event gives for a server that sent no heartbeat before the deploy stopped
# waiting for it: slow to start (a busy host), not seen failing; it has no last heartbeat either
NOT_STARTED = "not_started"


class Phase(StrEnum):
    STARTING = "starting"  # until the driver says deploy afresh or resume
    WAITING = "waiting"  # for every server's first heartbeat
    DEPLOYING = "deploying"  # primaries loading
    WARMING = "warming"  # first warm backups loading
    VERIFYING = "verifying"  # a resumed controller checks what servers really hold
    RUNNING = "running"


class Orchestrator:
    """The controller's decisions on a :class:`ClusterState`; see the module docstring.

    It detects failures, plans failovers and decides what runs when; two collaborators it holds carry
    out the rest, each owning its state: :attr:`operations` (per-app recoveries, upgrades, returns
    home and repairs: :class:`~failsoft.orchestration.operations.Operations`), :attr:`warm` (warm
    backups re-planned: :class:`~failsoft.orchestration.warm.WarmBackups`) and :attr:`copies` (the
    copies mechanisms pin: :class:`~failsoft.orchestration.copies.MechanismCopies`). All of them act on the
    cluster through one :class:`~failsoft.orchestration.effects.Effects` (:attr:`fx`): its loads,
    routes, timers and outbox.
    """

    def __init__(self, state: ClusterState, settings: OrchestrationSettings, now: float) -> None:
        self.state, self.settings = state, settings
        self.detector = HeartbeatDetector(
            settings.heartbeat_interval_s,
            settings.missed_to_fail,
            pause_grace=settings.pause_grace,
            link_grace_s=settings.link_grace_s,
        )
        self.fx = Effects(
            state, settings.load_slots, now, settings.heavy_load_slots, settings.heavy_loads_per_host
        )
        self.warm = WarmBackups(self.fx)
        self.copies = MechanismCopies(self.fx, settings.drain_s)
        self.replicas = Replicas(self.fx, settings.drain_s, backups_released=self.warm.mark_dirty)
        self.operations = Operations(
            self.fx, settings, routes_moved_home=self.warm.mark_dirty, home_ended=self._home_ended
        )
        self.deploys = Deploys(self.fx, self.operations, settings.drain_s, settings.retire_s)
        self.llm = LlmWorkers(self.fx)
        self.failed_queue: dict[str, float] = {}  # server -> when it was detected
        self.last_heard: dict[str, float] = {}
        self.heard_again: dict[str, float] = {}
        self.restoring: set[str] = set()
        self.crashed: dict[str, str] = {}  # failed on proof of death (its cause), not yet failed over
        self.planning: int | None = None
        self.last_plan: dict[str, Any] | None = None
        self.phase = Phase.STARTING
        self.ready = False
        self._plan_pending: dict[str, str] = {}
        self._plan_again = False
        self._planned_changes = -1
        self._next_sweep = now
        self._next_gc = now
        self._gc_pending: set[str] = set()
        self._gc_asked: dict[str, float] = {}  # server -> when its pending GC inspection was sent
        self._verify_pending: set[str] = set()
        self._deploy_deadline = now + settings.deploy_wait_s

    # life cycle ---------------------------------------------------------------------------------
    def deploy(self, now: float) -> list[Command]:
        """Deploy afresh: wait for the servers, load every primary, then the warm backups."""
        self.phase, self._deploy_deadline = Phase.WAITING, now + self.settings.deploy_wait_s
        return self._flush(now)

    def assume_deployed(self, now: float) -> list[Command]:
        """The state is already deployed (the simulator's steady state): every server is up now."""
        for name in self.state.servers:
            self.detector.register(name, now)
        self.phase, self.ready, self.warm.dirty = Phase.RUNNING, True, False
        return self._flush(now)

    def resume(self, docs: dict[str, Any], now: float) -> list[Command]:
        """Resume from a stored state: trust what servers report, not the store."""
        self.state.load_docs(docs)
        self.replicas.rewatch()
        for name, rec in self.state.servers.items():
            if rec.state in (ServerState.FAILED, ServerState.RECOVERING):
                rec.state = ServerState.FAILED
                self.detector.register(name, now - LONG_AGO_S)
            elif rec.state is not None:
                self.detector.register(name, now)
        self.fx.unrouted = {n for n, r in self.state.apps.items() if r.route is None}
        self.phase = Phase.VERIFYING
        self._verify_pending = {n for n, r in self.state.servers.items() if r.live}
        for name in sorted(self._verify_pending):
            self.fx.send(Inspect(name, InspectPurpose.VERIFY))
        self._finish_verify(now)
        return self._flush(now)

    # inputs: a deploy (failsoft deploy CONFIG; orchestration/deploy.py) ---------------------------
    def running(self, policy: str) -> Running:
        """What runs, as the deploy planner reads it (``policy``: the failover policy's name)."""
        st = self.state
        mine = {n for n in st.apps if st.deployment.has_app(n)}
        placed = {
            n: tuple(p for p in (r.route, r.final) if p is not None) for n, r in st.apps.items() if n in mine
        }
        warm = tuple(w.backup for (a, _), w in st.warm.items() if a in mine)
        return Running(st.deployment, policy, self.settings.replan_delay_s, placed, warm)

    def apply_deploy(
        self, desired: Desired, policy: str, digest: str | None, now: float
    ) -> tuple[DeployPlan, list[Command]]:
        """Plan ``desired`` against what runs and start carrying the plan out; an empty plan
        changes nothing. Raises :class:`~failsoft.orchestration.deploy.DeployRefused` (or
        ConfigError: not ready, a deploy under way), changing nothing."""
        from failsoft.errors import ConfigError

        if not self.ready:
            raise ConfigError("the cluster is not deployed yet: deploy once it is ready")
        if self.deploys.busy:
            raise ConfigError(
                f"a deploy is under way (config version {self.deploys.version}): wait until it is done"
            )
        plan = plan_deploy(self.running(policy), desired)
        if plan.empty:
            return plan, self._flush(now)
        if plan.replan_delay_s is not None:
            self.settings = dataclasses.replace(self.settings, replan_delay_s=plan.replan_delay_s)
            self.operations.settings = self.settings
        moved = {s.app for s in plan.steps if s.spec is not None}
        before = {n: r.app for n, r in self.state.apps.items() if n in moved}
        for name in self.state.adopt(apply_plan(self.state.deployment, plan)):
            self.fx.unrouted.add(name)
        self.warm.mark_dirty()
        self.fx.changes += 1
        self.deploys.start(plan, before, digest, now)
        self.fx.publish(force=True)
        return plan, self._flush(now)

    def _home_ended(self, op: Any, ok: bool, now: float) -> None:
        self.deploys.home_ended(op, ok, now)

    # inputs: mechanism copies (HAMS backups, Jellyfish rungs; see orchestration/copies.py) ------
    def pin(self, request: CopyRequest, now: float) -> tuple[str, list[Command]]:
        """Pin a mechanism's copy (:class:`~failsoft.orchestration.copies.CopyRequest`): the server
        it is on, and the commands (its :class:`Load`). Raises UnknownNameError or CapacityError,
        changing nothing."""
        server = self.copies.pin(request, now)
        return server, self._flush(now)

    def unpin(self, app: str, server: str, owner: str, now: float) -> list[Command]:
        """``owner`` gives up its copy of ``app`` on ``server`` (unloaded after the drain period)."""
        if self.copies.unpin(app, server, owner, now):
            self.warm.mark_dirty()
        return self._flush(now)

    # inputs: llm services' workers (member apps; see orchestration/llm.py) -------------------
    def place_llm(self, group: LlmGroup, now: float) -> list[Command]:
        """Place an ``llm`` service's workers on their servers (and its standbys): their memory
        is counted from now on. Raises CapacityError or UnknownNameError, changing nothing."""
        self.llm.place(group, now)
        return self._flush(now)

    def llm_started(
        self,
        service: str,
        worker: str,
        incarnation: int,
        phase: str,
        now: float,
        info: dict[str, Any] | None = None,
    ) -> list[Command]:
        """A worker's process serves its draft (``phase`` ``draft``) or its target (``serving``)."""
        self.llm.started(service, worker, incarnation, phase, info or {}, now)
        return self._flush(now)

    def llm_start_failed(
        self, service: str, worker: str, incarnation: int, error: str, now: float
    ) -> list[Command]:
        """A :class:`StartLlmWorker` or :class:`SwitchLlmTarget` could not be carried out."""
        self.llm.start_failed(service, worker, incarnation, error, now)
        return self._flush(now)

    def llm_died(
        self, service: str, worker: str, incarnation: int, reason: str, now: float
    ) -> tuple[bool, list[Command]]:
        """Proof that a worker's process is gone (its executor's probe, the gateway): whether a
        restart began (False: a stale report), and the commands."""
        began = self.llm.died(service, worker, incarnation, reason, now)
        return began, self._flush(now)

    def llm_standby_lost(self, service: str, server: str, reason: str, now: float) -> list[Command]:
        """A standby of ``service`` on ``server`` died or did not start (its executor's probe):
        no longer counted, and replaced shortly."""
        self.llm.standby_lost(service, server, reason, now)
        return self._flush(now)

    # inputs: replicas and autoscaling (see orchestration/replicas.py) -------------------------
    def observe_ongoing(self, app: str, ongoing: float, now: float) -> list[Command]:
        """``app`` has ``ongoing`` requests in flight across its replicas (the gateway's count, or
        the simulator's): an autoscaled app's replica count follows (Ray Serve's rule)."""
        self._check_app(app)
        self.replicas.observe(app, ongoing, now)
        return self._flush(now)

    def scale(self, app: str, replicas: int, now: float) -> list[Command]:
        """Have ``replicas`` servers serve ``app`` (an autoscaled app's policy may change it again)."""
        self._check_app(app)
        if any(app in s.members and s.mode is not ServiceMode.SINGLE for s in self.state.services.values()):
            raise ValueError(f"app {app!r} is a member of a service: only apps served alone scale")
        if not 1 <= replicas <= len(self.state.servers):
            raise ValueError(f"app {app!r}: replicas must be 1 to {len(self.state.servers)}; got {replicas}")
        self.replicas.scale(app, replicas, reason="requested")
        return self._flush(now)

    def _check_app(self, app: str) -> None:
        if app not in self.state.apps:
            raise UnknownNameError(f"no app {app!r} (apps: {', '.join(sorted(self.state.apps))})")

    def _replicas_wait(self, app: str) -> bool:
        """Replicas are placed once recoveries are done: they must not take what a failover needs
        (an app the last plan could not place does not hold them back)."""
        recovering = any(a not in self.fx.unrecovered for a in self.fx.unrouted)
        return app in self.operations or recovering or bool(self.failed_queue) or self.planning is not None

    # inputs: health -----------------------------------------------------------------------------
    def heartbeat(self, server: str, at: float, incarnation: str | None = None) -> list[Command]:
        """A heartbeat of ``server`` arrived at ``at`` (core time); cheap, for every heartbeat."""
        rec = self.state.servers[server]
        if rec.state is None:  # first word from this server
            self.detector.register(server, at)
            rec.state, rec.incarnation = ServerState.UP, incarnation
            return []
        if incarnation is not None and rec.incarnation is not None and incarnation != rec.incarnation:
            rec.restarts += 1
            self.detector.release(server)
            if rec.state in (ServerState.UP, ServerState.SUSPECT):
                # it restarted faster than two heartbeats: what it held is gone; fail it, restore next
                rec.incarnation = incarnation
                self.detector.forget(server)
                self.detector.register(server, at - LONG_AGO_S)
                return []
        if incarnation is not None:
            rec.incarnation = incarnation
        change = self.detector.heartbeat(server, at)
        if change is None:
            return []
        self._on_change(change, at)
        return self.fx.take()

    def check_health(self, now: float) -> list[Command]:
        """Judge every server at ``now`` (heartbeats arrived before ``now`` must have been fed)."""
        if not self._nobody_heard(now):
            for change in self.detector.check(now):
                self._on_change(change, now)
        return self._flush(now)

    def advance(self, now: float) -> list[Command]:
        """Time passed: fire due timers, start waiting failovers, reconcile."""
        return self._flush(now)

    def unhealthy(self, server: str, now: float, reason: str) -> list[Command]:
        """App-level verdict (the gateway's :class:`~failsoft.policies.detection.RouteHealth`):
        ``server`` heartbeats but fails its inferences. It is failed as if it had crashed, and its
        heartbeats are ignored for ``quarantine_s`` (or until it restarts)."""
        rec = self.state.servers.get(server)
        if rec is None or rec.state not in (ServerState.UP, ServerState.SUSPECT):
            return []  # unknown, or already failed or recovering: nothing to add
        change = self.detector.quarantine(server, now, now + self.settings.quarantine_s)
        log.warning("server %s heartbeats but does not serve (%s): failing it over", server, reason)
        if change is not None:
            self._on_change(change, now)
            self.fx.send(Emit("unhealthy", {"server": server, "reason": reason, "at": now}))
        return self._flush(now)

    def model_lost(self, app: str, server: str, variant: str, now: float, cause: str) -> list[Command]:
        """``server`` lives on but no longer holds ``app``'s ``variant``, the app's route: its agent
        refused a call for it (the gateway's report, ``cause`` ``call``) or an inspection of the
        server found it missing (``inspection``). Handled as a crash of that one copy, by the rule a
        crash follows: an app with a warm pinned copy on another live server is switched to it at
        once (route ``promoted``: HAMS's backup, which holds the state the lost copy had), else one
        with a warm backup on another live server is switched to the most accurate one (route
        ``warm``; it returns home once its home holds the model again, as after a crash). Any other
        is reloaded in place, *unrouted meanwhile*: the gateway's requests then wait for a route
        rather than call a server that refuses them, and the reloaded model comes back as a new
        route (a new ``route_at``), which the requests that found the loss retry on. A report about
        a copy that is not the app's route (it moved meanwhile) or while an operation of the app is
        under way (a repair, a return home) is stale: ignored."""
        self._lost(app, server, variant, now, cause)
        return self._flush(now)

    def _lost(self, app: str, server: str, variant: str, now: float, cause: str) -> None:
        """See :meth:`model_lost` (also the periodic inspection's path)."""
        rec = self.state.apps.get(app)
        where = Placement(server, variant)
        if rec is None or rec.route != where or not self.state.live(server) or app in self.operations:
            return
        self.state.servers[server].holdings.discard((app, variant))
        log.warning("server %s lost %s/%s (%s) while it lives", server, app, variant, cause)
        self.fx.emit("model_lost", app, where, detected_at=now, cause=cause)
        copy = self._pinned_copy(app, server) or self._warm_copy(app, server)
        if copy is None:  # FailLite's reload in place: no copy elsewhere holds the model
            self.fx.set_route(rec, None, rec.kind, rec.detected_at, now)
            rec.final = where  # its capacity stays reserved there while it reloads
            self.fx.publish(force=True)
            self.operations.repair(app, where, now)
            return
        kind = self._take_backup(app, copy, now, now)
        self.warm.dirty = True
        self.fx.changes += 1
        self.fx.attention.add(app)  # a warm switch returns home (reloaded there) at once
        self.fx.publish(force=True)
        self.fx.failover_event(app, kind, now, now, cause="model_lost")

    def _pinned_copy(self, app: str, lost_on: str | None = None) -> str | None:
        """The server of ``app``'s warm pinned copy *owned by a mechanism* on a live server other
        than ``lost_on`` (the server whose copy was lost), the copy a crash (:meth:`_switch_to_warm`)
        and a model loss (:meth:`_lost`) both promote; None when it has none. The first by server
        name when it has several.

        A replica, though pinned too, does not count: it holds what any warm backup of its variant
        holds (an app's replicas serve the same model and share no state), so the warm switch's
        rule chooses among it and the backups (:func:`warm_switches`: the most accurate live copy,
        ties to the roomiest server) and its route is ``warm``. A mechanism's copy holds what no
        other copy does (HAMS's backup: the state shipped to it), so it goes before any backup,
        however accurate. (The crash path once counted replicas here: a replica on ``s1`` then beat
        a HAMS copy on ``s2`` by name alone, and the app lost its state.)"""
        for server in sorted(s for a, s in self.state.warm if a == app and s != lost_on):
            w = self.state.warm[(app, server)]
            if (
                w.backup.pinned
                and w.owner != REPLICA_OWNER
                and w.state is BackupState.WARM
                and self.state.live(server)
            ):
                return server
        return None

    def _warm_copy(self, app: str, lost_on: str) -> str | None:
        """The server of the warm backup a crash of ``lost_on`` would switch ``app`` to (the most
        accurate live one: :func:`~failsoft.policies.failover.common.warm_switches`, the warm
        switch's one rule); None when it has none."""
        if not any(a == app and s != lost_on for a, s in self.state.warm):
            return None  # the common case: no snapshot to take
        scenario = self.state.snapshot()
        down = self.state.down() | {lost_on}
        apps = [a for a in scenario.apps if a.name == app]
        actions, _ = warm_switches(scenario, apps, down, initial_ledger(scenario, down))
        return actions[0].server if actions else None

    def link(self, server: str, incarnation: str | None, now: float) -> list[Command]:
        """The gateway's connection to ``server``'s agent (process ``incarnation``) is up: a
        silence of its heartbeats is then held as suspect a while (:meth:`HeartbeatDetector.link`)."""
        if self._current(server, incarnation):
            self.detector.link(server, True, now)
        return []

    def died(self, server: str, incarnation: str | None, now: float, cause: str) -> list[Command]:
        """Proof that ``server``'s agent process (``incarnation``) is gone, beside heartbeats: its
        sidecar saw it die (``cause`` ``process``) or the gateway's connection to it ended
        (``connection``). Failed now, not after missed heartbeats; its failure events carry
        ``cause``. A report about another incarnation than the one heartbeating is stale."""
        if not self._current(server, incarnation):
            return []
        change = self.detector.link(server, False, now)
        if change is None:
            return []
        log.warning(
            "server %s: its process is gone (%s): failed without waiting for heartbeats", server, cause
        )
        self.crashed[server] = cause
        self._on_change(change, now)
        return self._flush(now)

    def _current(self, server: str, incarnation: str | None) -> bool:
        rec = self.state.servers.get(server)
        return rec is not None and rec.state is not None and incarnation in (None, rec.incarnation)

    def _nobody_heard(self, now: float) -> bool:
        """Every live server silent at once, briefly: likelier our own stall than theirs.

        Verdicts are then held until the silence exceeds ``global_grace`` thresholds (a whole
        cluster going dark is still detected, a little later).
        """
        grace = self.settings.global_grace
        if grace is None:
            return False
        d = self.detector
        live = [s for s, st in d.states().items() if st in (ServerState.UP, ServerState.SUSPECT)]
        if len(live) < 2:
            return False
        silent = now - max(d.last_heartbeat(s) for s in live)
        threshold = d.interval_s * d.missed_to_fail
        return threshold < silent < grace * threshold

    def _on_change(self, change: HealthChange, now: float) -> None:
        server, rec = change.server, self.state.servers[change.server]
        if change.new is ServerState.FAILED:
            self.restoring.discard(server)
            if rec.state is ServerState.FAILED:  # already known (read back from the store)
                return
            self.failed_queue.setdefault(server, now)
            self.last_heard[server] = change.last_heartbeat
            self.fx.send(Emit("detected", {"server": server, "detected_at": now}))
        elif change.new is ServerState.RECOVERING:
            rec.state = ServerState.RECOVERING
            self.heard_again[server] = now
            self.restoring.add(server)
            self.fx.send(Inspect(server, InspectPurpose.RESTORE))
        elif rec.state is not ServerState.FAILED:
            rec.state = change.new

    # failures -------------------------------------------------------------------------------------
    def _start_failovers(self, now: float) -> None:
        """Hand detected failures on, once no other server is merely suspect (at most one interval
        after the first detection), so that a site failure is planned as one."""
        if not self.failed_queue:
            return
        first = min(self.failed_queue.values())
        interval = self.detector.interval_s
        crashed = all(server in self.crashed for server in self.failed_queue)  # no doubt: no waiting
        if (
            not crashed
            and now - first < interval
            and any(st is ServerState.SUSPECT for st in self.detector.states().values())
        ):
            self.fx.wake_at(first + interval)
            return
        failed, self.failed_queue = self.failed_queue, {}
        self._fail_servers(sorted(failed), first, now)
        self._plan(now)

    def _fail_servers(self, failed: list[str], detected_at: float, now: float) -> None:
        """Unroute the failed servers' apps, switch those with a warm backup to it at once, drop the
        failed servers' warm backups and loads, cancel what touches them; one route update for all."""
        hit = self._unroute(set(failed), detected_at, now)
        switched = self._switch_to_warm(detected_at, now)
        for server in failed:
            heard: float | None = self.last_heard.pop(server, detected_at)
            # a failure proof of death gave says so; one from heartbeats has no cause field
            cause = self.crashed.pop(server, None)
            if cause == NOT_STARTED:
                heard = None  # never heard: not an hour-old heartbeat
            why = {"cause": cause} if cause else {}
            for app, where in hit[server]:
                self.fx.emit("failure", app, where, detected_at=detected_at, last_heartbeat_at=heard, **why)
            if not hit[server]:
                self.fx.emit(
                    "failure",
                    None,
                    None,
                    server=server,
                    detected_at=detected_at,
                    last_heartbeat_at=heard,
                    **why,
                )
        self.fx.publish(force=True)  # clients hear of the failure, then of the new routes
        for app, kind in switched:
            self.fx.failover_event(app, kind, detected_at, now)

    def _unroute(
        self, failed: set[str], detected_at: float, now: float
    ) -> dict[str, list[tuple[str, Placement]]]:
        self.fx.changes += 1
        for name in failed:
            rec = self.state.servers[name]
            rec.state, rec.failed_at = ServerState.FAILED, detected_at
            rec.holdings = set()
            self.operations.server_failed(name)
            for job in self.fx.clear_loads(name):
                if job.warm:
                    self.warm.forget_load(job.load_id)
        for key in [k for k in self.state.warm if k[1] in failed]:
            del self.state.warm[key]
            self.warm.dirty = True
        self.llm.servers_failed(failed, now)  # member apps of llm services fail with them
        hit: dict[str, list[tuple[str, Placement]]] = {s: [] for s in failed}
        touching = self.operations.working_with(failed)  # a few apps of many: the others skip the call
        for name, rec in self.state.apps.items():
            if (name in touching and self.operations.works_with(name, failed)) or (
                rec.final and rec.final.server in failed
            ):
                self.operations.cancel(name, now)
                rec.final = None
            if rec.route is not None and rec.route.server in failed:
                hit[rec.route.server].append((name, rec.route))
                self.fx.set_route(rec, None, rec.kind, rec.detected_at, now)
                rec.final = None
                self.operations.cancel(name, now)
        self.warm.finish_if_done()
        return hit

    def _switch_to_warm(self, detected_at: float, now: float) -> list[tuple[str, str]]:
        """FailLite's first reaction: an affected app with a live warm backup switches to it now,
        before any planning (every policy makes the same choice: the most accurate live backup).
        An app with a mechanism's warm pinned copy (:meth:`_pinned_copy`, the one a model loss
        promotes too) switches to that one (it holds what others do not: HAMS's state), and the
        route is ``promoted``. The apps switched, with the kind of their failover."""
        down = self.state.down()
        backups: dict[str, int] = {}
        for (app, server), w in self.state.warm.items():
            if w.state is BackupState.WARM and server not in down:
                backups[app] = backups.get(app, 0) + 1
        waiting = [
            a
            for a in sorted(self.fx.unrouted)
            if a in backups and a not in self.operations and self.state.apps[a].final is None
        ]  # affected apps (no route, capacity reserved at a down home) with a live backup
        if not waiting:
            return []
        pinned = {a: s for a in waiting if (s := self._pinned_copy(a)) is not None}
        switched = [(a, self._take_backup(a, s, detected_at, now)) for a, s in pinned.items()]
        scenario = self.state.snapshot()
        affected = [a for a in affected_apps(scenario, down) if a.name in waiting and a.name not in pinned]
        ties = any(backups[a.name] > 1 for a in affected)  # only ties need the capacity ledger
        ledger = initial_ledger(scenario, down) if ties else Ledger({})
        actions, _ = warm_switches(scenario, affected, down, ledger)
        switched += [(a.app, self._take_backup(a.app, a.server, detected_at, now)) for a in actions]
        if switched:
            self.warm.dirty = True
        return switched

    def _take_backup(self, app: str, server: str, detected_at: float, now: float) -> str:
        """Route ``app`` to its warm backup on ``server`` (which stops being a backup); the kind of
        failover: ``warm``, or ``promoted`` for a pinned copy."""
        rec = self.state.apps[app]
        backup = self.state.warm.pop((app, server))
        promoted = backup.backup.pinned and backup.owner != REPLICA_OWNER  # a replica is a warm switch
        kind = RouteKind.PROMOTED if promoted else RouteKind.WARM
        self.fx.set_route(rec, Placement(server, backup.backup.variant), kind, detected_at, now)
        return kind.value

    # planning --------------------------------------------------------------------------------------
    def _plan(self, now: float) -> None:
        """Ask for a failover plan of every app whose placement is on a down server (one at a time)."""
        if self.planning is not None:
            self._plan_again = True
            return
        inputs = self._failover_inputs()
        if inputs is None:
            return
        scenario, down, pending = inputs
        self._planned_changes = self.fx.changes
        if not pending:
            return
        self.planning, self._plan_pending = self.fx.next_plan_id(), pending
        self.fx.send(PlanFailover(self.planning, scenario, down))

    def _failover_inputs(self) -> tuple[Scenario, tuple[str, ...], dict[str, str]] | None:
        """The cluster as a failover plan sees it now, the down servers and the apps to plan (those
        on a down server that no operation recovers); None while no server is down."""
        down = self.state.down()
        if not down:
            return None
        scenario = self.state.snapshot()
        pending = {
            a.name: a.primary.server
            for a in scenario.apps
            if a.primary is not None and a.primary.server in down and a.name not in self.operations
        }
        return scenario, tuple(sorted(down)), pending

    def failover_plan_starting(self, plan_id: int) -> PlanFailover | None:
        """The driver is about to run the policy for ``plan_id``: where failures arrived since it was
        asked (a correlated failure: two servers' death notices a few milliseconds apart, while the
        controller's loop was busy with the first), the plan as the cluster is now, which they join
        (None: the plan asked is still the cluster's). One plan then orders every affected app's
        loads shortest first together, where two would let the first plan's loads take the slots
        before the second's shorter ones exist; it costs nothing, the policy not having run yet."""
        if plan_id != self.planning or not self._plan_again:
            return None
        inputs = self._failover_inputs()
        if inputs is None or not inputs[2]:  # nothing left to plan: the plan asked runs, checked
            return None
        scenario, down, pending = inputs
        self._planned_changes, self._plan_pending, self._plan_again = self.fx.changes, pending, False
        return PlanFailover(plan_id, scenario, down)

    def failover_planned(
        self, plan_id: int, plan: FailoverPlan | None, now: float, error: str | None = None
    ) -> list[Command]:
        """The driver ran the failover policy (``plan`` None: it failed, ``error`` says why)."""
        if plan_id != self.planning:
            return self._flush(now)
        self.planning, pending = None, self._plan_pending
        if plan is None:
            log.warning("failover planning failed: %s (planned again)", error)
            self._planned_changes = -1
            self.fx.wake_at(now + self.settings.backoff_base_s, ("replan", None))
        else:
            self.last_plan = plan.to_dict()
            failed_at = {
                app: self.state.servers[server].failed_at or now for app, server in pending.items()
            }  # the MTTR of an app counts from the detection of *its* server's failure
            self._execute(plan, failed_at, now)
        if self._plan_again:
            self._plan_again = False
            self._plan(now)
        return self._flush(now)

    def proactive_planned(
        self, plan_id: int, plan: ProactivePlan | None, now: float, error: str | None = None
    ) -> list[Command]:
        """The driver ran the proactive policy (``plan`` None: it failed, ``error`` says why)."""
        self.warm.planned(plan_id, plan, now, error)
        return self._flush(now)

    def _applicable(self, action: FailoverAction, failed_at: dict[str, float]) -> bool:
        """An action still applies when its app waits for it and its servers are still live."""
        rec = self.state.apps[action.app]
        servers = {action.server, action.stand_in_server}
        return (
            action.app in failed_at
            and action.app not in self.operations
            and rec.route is None
            and all(self.state.live(s) for s in servers)
            and (action.kind is not ActionKind.WARM or (action.app, action.server) in self.state.warm)
        )

    def _execute(self, plan: FailoverPlan, failed_at: dict[str, float], now: float) -> None:
        actions = [a for a in plan.actions if self._applicable(a, failed_at)]
        self.fx.send(Planned(plan, now, tuple(actions)))
        warm = [a for a in actions if a.kind is ActionKind.WARM]
        kinds = [self._take_backup(a.app, a.server, failed_at[a.app], now) for a in warm]
        if warm:
            self.fx.publish()
        for action, kind in zip(warm, kinds, strict=True):
            self.fx.failover_event(action.app, kind, failed_at[action.app], now)
        for backup in plan.released:  # before any load: the loads need that memory
            rec = self.state.warm.get((backup.app, backup.server))
            if rec is not None and rec.backup == backup:
                del self.state.warm[(backup.app, backup.server)]
                if not self.fx.needed(backup.app, backup.server, backup.variant):
                    self.fx.unload(backup.server, backup.app, backup.variant)
        # shortest first (critical apps before), so the loads that take the free slots at once are
        # the shortest, not the plan's first (orchestration.loads)
        loads = sorted((a for a in actions if a.kind is not ActionKind.WARM), key=self._first_load_order)
        group = Group({a.app for a in loads})
        for action in loads:
            self.operations.recover(action, failed_at[action.app], group, now)
        for app in plan.unrecovered:
            if app in failed_at and app not in self.fx.unrecovered:
                self.fx.unrecovered.add(app)  # said once per outage, not at every retry
                self.fx.emit("unrecovered", app, None)
        self.warm.dirty = True

    def _first_load_order(self, action: FailoverAction) -> tuple[bool, float]:
        """Critical apps first, then the shortest first load (its profiled ``load_ms``)."""
        critical = self.state.apps[action.app].app.critical
        return (not critical, self.state.variant(action.app, action.first_variant).load_ms)

    # inputs: loads and inspections -------------------------------------------------------------------
    def load_done(
        self, load_id: int, ok: bool, now: float, info: dict[str, Any] | None = None, error: str | None = None
    ) -> list[Command]:
        """A :class:`Load` finished (``ok``) or failed (``error`` says why)."""
        job = self.fx.finish_load(load_id)
        if job is None:  # its server failed meanwhile: nothing it did counts
            return self._flush(now)
        if ok:
            self.state.servers[job.server].holdings.add((job.app, job.variant))
        else:
            log.warning("load of %s/%s on %s failed: %s", job.app, job.variant, job.server, error)
        op = self.operations.waiting_for(job.app, load_id)
        if job.orphan or (not job.warm and op is None):
            if ok and not self.fx.needed(job.app, job.server, job.variant):
                self.fx.unload(job.server, job.app, job.variant)
        elif job.pinned:
            rec = self.state.warm.get((job.app, job.server))
            if rec is not None and rec.owner == REPLICA_OWNER and rec.backup.variant == job.variant:
                self.replicas.loaded(ok, job.app, now)
            self.copies.loaded(ok, job.app, job.server, job.variant, now)
        elif job.warm:
            self.warm.loaded(load_id, ok, job.app, job.server, job.variant)
        else:
            assert op is not None
            self.operations.loaded(op, ok, info or {}, now)
        return self._flush(now)

    def inspected(
        self, server: str, purpose: InspectPurpose, report: dict[str, Any] | None, now: float
    ) -> list[Command]:
        """What ``server`` reported it holds (``report`` None: it did not answer)."""
        if purpose is InspectPurpose.RESTORE:
            self._restore(server, report, now)
        elif purpose is InspectPurpose.GC:
            self._gc_report(server, report, now)
        else:
            self._verify_pending.discard(server)
            if report is not None:
                self._note_report(server, report)
            self._finish_verify(now)
        return self._flush(now)

    def _note_report(self, server: str, report: dict[str, Any]) -> set[tuple[str, str]]:
        rec = self.state.servers[server]
        held = {(a, v) for a, v in report.get("models", [])}
        rec.holdings = set(held)
        rec.incarnation = report.get("incarnation", rec.incarnation)
        rec.pid = report.get("pid", rec.pid)
        return held

    def _restore(self, server: str, report: dict[str, Any] | None, now: float) -> None:
        """A failed server speaks again: unload what it should not hold, then it is up (its apps
        return home at the next reconciliation)."""
        if server not in self.restoring:
            return  # failed again meanwhile
        self.restoring.discard(server)
        rec = self.state.servers[server]
        if report is None:  # not reachable after all: failed again; the next heartbeat retries
            self.detector.forget(server)
            self.detector.register(server, now - LONG_AGO_S)
            rec.state = ServerState.FAILED
            return
        held = self._note_report(server, report)
        keep = {(a, r.home.variant) for a, r in self.state.apps.items() if r.home.server == server}
        for app, variant in sorted(held - keep):
            self.fx.unload(server, app, variant)
        self.detector.mark_up(server, now)
        rec.state = ServerState.UP
        self.warm.dirty = True
        self.fx.changes += 1
        self.fx.emit(
            "server_up", None, None, server=server, heard_again_at=self.heard_again.pop(server, None)
        )
        self.fx.attention.update(a for a, r in self.state.apps.items() if r.home.server == server)

    def _gc_report(self, server: str, report: dict[str, Any] | None, now: float) -> None:
        self._gc_pending.discard(server)
        asked = self._gc_asked.pop(server, now)
        if report is None or self.state.servers[server].state is not ServerState.UP:
            return
        held = self._note_report(server, report)
        needed = self.state.needed_on(server)
        for app, variant in sorted(held - needed):
            if app not in self.operations and not self.warm.loading(app):
                self.fx.unload(server, app, variant)
        for app, variant in sorted(needed - held):
            routed_at = self.state.apps[app].route_at  # a route set since may be newer than the report
            if routed_at is None or routed_at <= asked:
                self._lost(app, server, variant, now, "inspection")

    def _finish_verify(self, now: float) -> None:
        if self.phase is not Phase.VERIFYING or self._verify_pending:
            return
        for name, app in self.state.apps.items():
            r = app.route
            if (
                r is not None
                and self.state.live(r.server)
                and (name, r.variant) not in self.state.servers[r.server].holdings
            ):
                self.fx.set_route(app, None, app.kind, app.detected_at, now)
        for key, w in list(self.state.warm.items()):
            if (w.backup.app, w.backup.variant) not in self.state.servers[w.backup.server].holdings:
                del self.state.warm[key]
                self.warm.dirty = True
        self._become_ready(now, resumed=True)

    # the step run after every input ---------------------------------------------------------------
    def _flush(self, now: float) -> list[Command]:
        self._step(now)
        return self.fx.take()

    def _step(self, now: float) -> None:
        self._fire_timers(now)
        self._start_failovers(now)
        self._progress_deploy(now)
        if self.ready:
            self._reconcile(now)
            self.replicas.reconcile(now, self._replicas_wait)
            self._collect_garbage(now)
        self.fx.publish()

    def _progress_deploy(self, now: float) -> None:
        if self.phase is Phase.WAITING:
            heard = all(r.state is not None for r in self.state.servers.values())
            if not heard and now < self._deploy_deadline:
                return
            for name, rec in self.state.servers.items():
                if rec.state is None:  # never came up: planned around, restored if it ever heartbeats
                    log.warning("server %s did not start in time: treated as failed", name)
                    self.detector.register(name, now - LONG_AGO_S)
                    self.crashed[name] = NOT_STARTED  # no doubt to wait out, and its event says why
            for name, rec in self.state.apps.items():
                if self.state.live(rec.home.server):
                    self.operations.return_home(name, now, event=None)
            self.phase = Phase.DEPLOYING
        if self.phase is Phase.DEPLOYING and not self.operations and self.planning is None:
            self.phase = Phase.WARMING
            self.replicas.reconcile(now, self._replicas_wait)  # replicas first, backups in what is left
            if self.settings.replan_warm:
                self.warm.start()
        if self.phase is Phase.WARMING and not self.warm.busy and not self.replicas.loading:
            self.warm.dirty = False
            self._become_ready(now, resumed=False)

    def _become_ready(self, now: float, resumed: bool) -> None:
        self.phase, self.ready = Phase.RUNNING, True
        self.fx.publish(force=True)
        self.fx.emit("ready", None, None, resumed=resumed)

    def _reconcile(self, now: float) -> None:
        """Start what the state calls for: upgrades left half done, returns home, failover plans for
        apps left without a route, and (once all is quiet) new warm backups."""
        s = self.settings
        if not (
            self.fx.attention or self.fx.unrouted or (s.replan_warm and self.warm.dirty) or s.reconcile_s
        ):
            return  # nothing to look at: the common case between a simulated event's inputs
        if s.reconcile_s is not None and now >= self._next_sweep:
            self.fx.attention.update(self.state.apps)
            self._next_sweep = now + s.reconcile_s
        attention, self.fx.attention = self.fx.attention, set()
        for name in sorted(attention):
            if name in self.operations or self.operations.backing_off(name, now) or self.deploys.holds(name):
                continue
            rec = self.state.apps.get(name)
            if rec is None or self.state.retiring(name):
                continue
            home_up = self.state.servers[rec.home.server].state is ServerState.UP
            if rec.final is not None:
                self.operations.resume_upgrade(name, now)
            elif rec.route != rec.home and home_up and rec.kind is not RouteKind.PROMOTED:
                self.operations.return_home(name, now)
        needs_plan = any(
            a not in self.operations and not self.operations.backing_off(a, now) for a in self.fx.unrouted
        )
        if needs_plan and not self.failed_queue and self.fx.changes != self._planned_changes:
            self._plan(now)
        if s.replan_warm and self.warm.dirty and not needs_plan and not self.busy:
            due = self.fx.last_change + s.replan_delay_s
            if now >= due:
                self.warm.start()
            else:
                self.fx.wake_at(due)

    def _collect_garbage(self, now: float) -> None:
        gc_s = self.settings.gc_s
        if gc_s is None or now < self._next_gc or self._gc_pending:
            return
        self._next_gc = now + gc_s
        for name, rec in self.state.servers.items():
            if rec.state is ServerState.UP:
                self._gc_pending.add(name)
                self._gc_asked[name] = now
                self.fx.send(Inspect(name, InspectPurpose.GC))

    # timers -----------------------------------------------------------------------------------------
    def _fire_timers(self, now: float) -> None:
        while (due := self.fx.pop_due(now)) is not None:
            kind, payload = due
            if kind == "drain":
                app, server, variant = payload
                if self.state.live(server) and not self.fx.needed(app, server, variant):
                    self.fx.unload(server, app, variant)
                if self.state.draining.pop((app, server), None) is not None:
                    self.fx.publish(force=True)  # the gateway forgets the dropped replica
            elif kind == "attend":
                self.fx.attention.add(payload)
                self.fx.changes += 1
            elif kind == "replan":
                self.fx.changes += 1
            elif kind in ("deploy-retire", "deploy-step"):
                self.deploys.timer(kind, payload, now)
            elif kind == RETRY_TIMER:
                self.llm.retry(payload, now)
            elif kind == STANDBY_TIMER:
                self.llm.replace_standby(payload, now)

    def next_wakeup(self) -> float | None:
        """When the core next needs :meth:`advance` (None: only when an input arrives)."""
        return self.fx.next_wakeup()

    # queries ----------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Operations, a plan or a warm-backup re-plan under way."""
        return bool(self.operations) or self.warm.busy or self.planning is not None or self.deploys.busy

    @property
    def idle(self) -> bool:
        """Nothing under way and nothing waiting: no failure queued, no timer set."""
        return not self.busy and not self.failed_queue and self.fx.next_wakeup() is None and not self.fx.jobs
