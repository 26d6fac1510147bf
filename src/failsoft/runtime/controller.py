"""The controller: one async Ray actor that detects failures and runs FailLite's two steps (3.4, 4).

Its decisions are the orchestration core's (:class:`~failsoft.orchestration.Orchestrator`, shared
with the simulator); the controller gives the core its inputs and carries out its commands through a
:class:`~failsoft.runtime.core_driver.CoreDriver`:

* heartbeats: UDP datagrams stamped on arrival by the kernel (:mod:`failsoft.runtime.heartbeat`),
  drained every few milliseconds into :meth:`Orchestrator.heartbeat`, then
  :meth:`Orchestrator.check_health` (the detector's verdicts, failovers, reconciliation, timers).
  Arrival times are the kernel's, so a stalled loop delays verdicts but never fakes a silence;
* routes and events go out by long-poll (:mod:`failsoft.runtime.longpoll`), every table is also
  pushed to the gateways at once (:mod:`failsoft.runtime.routepush`), the state goes to the store
  (SQLite or Redis) whenever it changed.

At start the controller deploys (primaries, then warm backups from the proactive policy); when Ray
restarts it after a crash, it resumes from the store instead, keeping every model that healthy
servers still hold; it opens the store only then, retried every second, since Ray never restarts an
actor whose constructor raised. Until it is ready it hands out no routing table (a long-poll that
times out meanwhile is answered "nothing new"), so a gateway keeps the table it has rather than
mirroring an empty one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import os
import time
from typing import Any

from failsoft.clock import AsyncClock, MonotonicClock
from failsoft.domain import Scenario
from failsoft.errors import FailsoftError, StoreError
from failsoft.orchestration import ClusterState, CopyRequest, OrchestrationSettings, Orchestrator
from failsoft.orchestration.deploy import Desired, plan_deploy
from failsoft.runtime import cluster, eventlog
from failsoft.runtime.config import RuntimeConfig
from failsoft.runtime.core_driver import CoreDriver
from failsoft.runtime.heartbeat import Beat, HeartbeatEndpoint, HeartbeatReceiver
from failsoft.runtime.llm_fleet import LlmFleet
from failsoft.runtime.longpoll import EventLog, VersionedValue
from failsoft.runtime.loop import StepRunner, spawn
from failsoft.runtime.planner import Planner
from failsoft.runtime.priority import CONTROLLER_NICE, set_niceness
from failsoft.runtime.routepush import RoutePublisher
from failsoft.runtime.store import Store, open_store
from failsoft.scenario import scenario_from_dict, scenario_to_dict

log = logging.getLogger(__name__)
RECONCILE_S = 0.25
# A silent server whose data-plane connection is up is failed this much past the heartbeat
# threshold: heartbeats late behind a busy host (a sidecar waiting for a core) arrive within it, and
# a dead process ends its connection at once anyway (docs/runtime.md, "The data plane").
LINK_GRACE_S = 0.25
GC_S = 2.0
GLOBAL_GRACE = 5.0


def parallel_heavy_loads(config: RuntimeConfig) -> int:
    """Heavy loads that run at once per server (or on the whole host: ``agents.heavy_loads_per_host``):
    the config's ``agents.max_parallel_heavy_loads``, else one per core this host leaves to loads."""
    from failsoft.orchestration.loads import heavy_load_slots
    from failsoft.zoo.machine import usable_cores

    chosen = config.agents.max_parallel_heavy_loads
    return chosen if chosen is not None else heavy_load_slots(float(usable_cores()))


def orchestration_settings(config: RuntimeConfig) -> OrchestrationSettings:
    """The core's settings for a serving config (the simulator's twin takes the same ones)."""
    hb = config.heartbeat
    return OrchestrationSettings(
        heartbeat_interval_s=hb.interval_s,
        missed_to_fail=hb.missed_to_fail,
        pause_grace=True,
        global_grace=GLOBAL_GRACE,
        load_slots=config.agents.max_parallel_loads,
        heavy_load_slots=parallel_heavy_loads(config),
        heavy_loads_per_host=config.agents.heavy_loads_per_host,
        drain_s=config.agents.drain_ms / 1000.0,
        replan_delay_s=config.replan_delay_s,
        reconcile_s=RECONCILE_S,
        gc_s=GC_S,
        link_grace_s=LINK_GRACE_S,
    )


class Controller:
    """The cluster's brain. Ray runs all its methods on one event loop: no locks around state."""

    def __init__(
        self,
        config: RuntimeConfig,
        deployment: Scenario,
        heartbeat: HeartbeatEndpoint,
        clock: AsyncClock | None = None,
    ) -> None:
        cluster.configure_actor_logging()
        self.config = config
        self.clock = clock or MonotonicClock()
        self.state = ClusterState(deployment)
        self.core = Orchestrator(self.state, orchestration_settings(config), self.clock.now())
        self.tick_s = min(0.005, config.heartbeat.interval_s / 4)
        self.routes = VersionedValue(self.state.routes())
        self.pusher = RoutePublisher(cluster.node_address())  # the tables' fast path to the gateways
        self.events = EventLog(epoch=self.routes.epoch)
        self.steps = StepRunner(slow_s=max(config.heartbeat.interval_s, 0.02))
        self.restarted = cluster.actor_was_restarted()
        # a first start fails fast on a store it cannot reach; a restarted controller must not: an
        # actor whose constructor raises is never restarted by Ray, so it opens its store in _start
        self.store: Store | None = None if self.restarted else self._open_store()
        self._started = False  # deploying or resuming: only then is the state worth persisting
        self._resumed = False
        self.digest = _digest(config, deployment)
        self.policy = config.policy  # the failover policy served now (a deploy may change it)
        self.planner = Planner(config.policy)
        self.driver = CoreDriver(
            self.core,
            self.planner,
            self._agent,
            self._publish,
            self._emit,
            self.clock,
            self._forget_agent,
            self._llm_command,
        )
        self.tasks: set[asyncio.Task[Any]] = set()
        self._agents: dict[str, cluster.AgentRef] = {}
        self._dirty = asyncio.Event()
        self._ready = asyncio.Event()
        self._last_check = self.clock.now()
        self.late_ticks = 0
        self.receiver = HeartbeatReceiver(heartbeat, set(self.state.servers))
        # llm services: their workers are the core's member apps, each fleet carries its commands out
        reports = _LlmReports(self)
        self.fleets = {
            s.name: LlmFleet(s, self.clock, reports, functools.partial(self.state.llm.of, s.name))
            for s in config.llm
        }
        self.llm_refused: dict[str, FailsoftError] = {}  # an llm service the core could not place
        gc.freeze()  # keep full collections (hundreds of ms over Ray's and numpy's objects) off the loop
        set_niceness(CONTROLLER_NICE, whole_process=True)
        spawn(self._main(), "controller-main", self.tasks)

    @property
    def ready(self) -> bool:
        return self.core.ready

    # plumbing --------------------------------------------------------------------------------
    @property
    def _store_url(self) -> str:
        return self.store.url if self.store is not None else self.config.store_url

    def _open_store(self) -> Store:
        return open_store(self.config.store_url, self.config.state_dir, self.config.name)

    def _agent(self, server: str) -> cluster.AgentRef:
        if server not in self._agents:
            self._agents[server] = cluster.find_agent(server)
        return self._agents[server]

    def _forget_agent(self, server: str) -> None:
        self._agents.pop(server, None)  # a dead actor's handle would keep its name taken

    def _publish(self) -> None:
        self.routes.publish(self.state.routes())
        self.pusher.send(self._snapshot(self.routes.snapshot()))
        if self.core.ready:
            self._ready.set()
        self._dirty.set()

    def _emit(self, event_type: str, fields: dict[str, Any]) -> None:
        event = self.events.append({"type": event_type, "timestamp": time.time(), **fields})
        log.info("event %s", json.dumps(event, default=str))
        eventlog.record(event)
        self._dirty.set()

    def _feed(self, commands: list[Any]) -> None:
        if commands:
            self.driver.feed(commands)
            self._dirty.set()

    # heartbeats ------------------------------------------------------------------------------------
    def _on_beat(self, beat: Beat) -> None:
        rec = self.state.servers[beat.server]
        if rec.incarnation is not None and rec.incarnation != beat.incarnation:
            self._forget_agent(beat.server)  # a new process (maybe a new actor): look it up again
        if beat.dead:  # the sidecar saw the agent process die: no silence to wait out
            self._feed(self.core.died(beat.server, beat.incarnation, beat.arrived, "process"))
            return
        self._feed(self.core.heartbeat(beat.server, beat.arrived, beat.incarnation))

    # API: gateway, CLI, tests ---------------------------------------------------------------------
    async def wait_routes(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        """The routing table once newer than ``(epoch, version)``; never before the controller is
        ready (deploying or resuming), so that a gateway never mirrors a table without routes.

        Not ready by ``timeout_s`` (a resume waiting for its store): the caller's own epoch and
        version, ``value`` None and ``ready`` False, which a mirror takes as "nothing new"."""
        deadline = self.clock.now() + timeout_s
        if not self.core.ready:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout_s)
            if not self.core.ready:
                return {"epoch": epoch, "version": version, "value": None, "ready": False}
        left = max(deadline - self.clock.now(), 0.0)
        return self._snapshot(await self.routes.wait_newer(epoch, version, left))

    def _snapshot(self, snap: dict[str, Any]) -> dict[str, Any]:
        """A table as the gateways take it, by long-poll or push: with ``ready``, the failure
        stamps (``fences``) and where the tables are pushed (``push``, :mod:`~failsoft.runtime.routepush`)."""
        return {**snap, "ready": self.core.ready, "fences": self._fences(), "push": self.pusher.endpoint}

    def _fences(self) -> dict[str, float]:
        """Each server's last failure stamp, for the gateway's fence: read in the same step as the
        table it goes with, so a server failed in that table has its new stamp. Wall-clock
        milliseconds, so that a controller resumed from the store sends the same stamps."""
        stamps = {n: self.state.wall(r.failed_at) for n, r in self.state.servers.items()}
        return {n: round(t, 3) for n, t in stamps.items() if t is not None}

    async def wait_events(self, epoch: str, seq: int, timeout_s: float) -> dict[str, Any]:
        return await self.events.wait_after(epoch, seq, timeout_s)

    async def report_unhealthy(self, server: str, reason: str) -> bool:
        """The gateway's app-level verdict: ``server`` heartbeats but fails its inferences. True when
        it was failed over (False: unknown, or already failed)."""
        if server not in self.state.servers:
            return False
        commands = self.core.unhealthy(server, self.clock.now(), reason)
        self._feed(commands)
        return bool(commands)

    async def report_ongoing(self, counts: dict[str, int]) -> None:
        """The gateway's requests in flight per autoscaled app: the core's autoscaling reads them
        (Ray Serve's rule; a ``scale`` event when an app's replica count changes)."""
        if not self.core.ready:
            return
        now = self.clock.now()
        for app, ongoing in counts.items():
            if app in self.state.apps:
                self._feed(self.core.observe_ongoing(app, float(ongoing), now))

    async def report_link(self, server: str, incarnation: str | None, up: bool, reason: str) -> bool:
        """The gateway's data-plane connection to ``server``'s agent was made (``up``) or ended (the
        process is gone): the detector's second signal. True when that failed the server now."""
        if server not in self.state.servers:
            return False
        now = self.clock.now()
        if up:
            commands = self.core.link(server, incarnation, now)
        else:
            log.warning("server %s: its data-plane connection ended (%s)", server, reason)
            commands = self.core.died(server, incarnation, now, "connection")
        self._feed(commands)
        return bool(commands)

    async def pin(self, request: CopyRequest) -> str:
        """A mechanism's copy (a Jellyfish rung, a HAMS backup): the core plans its load, counts it
        and publishes it in the routing table (``pinned``, ``ready`` once loaded). The server it is
        on; CapacityError or UnknownNameError when it cannot be placed."""
        server, commands = self.core.pin(request, self.clock.now())
        self._feed(commands)
        return server

    async def unpin(self, app: str, server: str, owner: str) -> None:
        """``owner`` gives its copy of ``app`` on ``server`` up (unloaded after the drain period)."""
        self._feed(self.core.unpin(app, server, owner, self.clock.now()))

    async def report_model_lost(self, app: str, server: str, variant: str) -> None:
        """The gateway's call found ``server`` (heartbeating) without ``app``'s ``variant``
        (ModelNotLoadedError): the core promotes the app's pinned copy as for a crash, or reloads
        the model in place (``Orchestrator.model_lost``); a stale report changes nothing."""
        if app in self.state.apps and server in self.state.servers:
            self._feed(self.core.model_lost(app, server, variant, self.clock.now(), "call"))

    # API: deploys (failsoft deploy CONFIG through the gateway's admin API) --------------------------
    async def deployment(self) -> dict[str, Any]:
        """What runs: the deployment (every app's home), the failover policy and the config version."""
        return {
            "deployment": self.state.deployment,
            "policy": self.policy,
            "replan_delay_s": self.core.settings.replan_delay_s,
            "version": self.core.deploys.version,
            "warm": [w.backup for w in self.state.warm.values()],
        }

    async def deploy(self, desired: Desired, digest: str | None, dry_run: bool = False) -> dict[str, Any]:
        """Plan ``desired`` against what runs and (unless ``dry_run``) carry the plan out through the
        core. DeployRefused or ConfigError (one line) when it cannot be applied: nothing changed."""
        if dry_run:
            plan = plan_deploy(self.core.running(self.policy), desired)
            return {
                "changed": False,
                "dry_run": True,
                "version": self.core.deploys.version,
                "plan": plan.to_dict(),
            }
        plan, commands = self.core.apply_deploy(desired, self.policy, digest, self.clock.now())
        if plan.policy_name is not None:
            old, self.policy = self.planner, plan.policy_name
            self.planner = self.driver.planner = Planner(plan.policy_name)
            await asyncio.to_thread(old.close)
        self._feed(commands)
        self._dirty.set()
        log.info("deploy: config version %d, plan %s", self.core.deploys.version, json.dumps(plan.to_dict()))
        return {"changed": not plan.empty, "version": self.core.deploys.version, "plan": plan.to_dict()}

    async def deploy_status(self) -> dict[str, Any]:
        """The config version served and the last deploy (under way or done)."""
        self.state.sync_wall(time.time(), self.clock.now())
        return self.core.deploys.to_dict(self.state.wall_offset)

    async def wait_ready(self, timeout_s: float) -> bool:
        """Whether every app is deployed and every llm service's workers serve, by ``timeout_s``;
        an llm service the core refused to place (CapacityError, naming the server) raises."""
        deadline = self.clock.now() + timeout_s
        while True:
            for exc in self.llm_refused.values():
                raise exc
            if self.core.ready and all(f.ready.is_set() for f in self.fleets.values()):
                return True
            if self.clock.now() >= deadline:
                return False
            await self.clock.sleep(0.02)

    # llm services: placed by the core, carried out by runtime/llm_fleet.py -------------------------
    async def _place_llm(self, fleet: LlmFleet) -> None:
        """Build the service's model if needed (retried every second while that fails), then have
        the core place its workers; a refusal (no room, an unknown server) is final and said once."""
        while True:
            try:
                group = await fleet.prepare()
                break
            except Exception:
                log.exception("llm service %s could not be prepared; retrying in 1 s", fleet.name)
                await self.clock.sleep(1.0)
        try:
            self._feed(self.core.place_llm(group, self.clock.now()))
        except FailsoftError as exc:
            log.error("llm service %s cannot be placed: %s", fleet.name, exc)
            self.llm_refused[fleet.name] = exc
            self._emit("llm-service-refused", {"service": fleet.name, "reason": str(exc)})

    def _llm_command(self, command: Any) -> None:
        self.fleets[command.service].execute(command)

    async def wait_llm(self, service: str, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        """An llm service's worker table once newer than ``(epoch, version)`` (the gateway's
        dispatcher long-polls it)."""
        return await self._fleet(service).table.wait_newer(epoch, version, timeout_s)

    async def llm_failed(self, service: str, worker: str, incarnation: int, reason: str) -> bool:
        """The gateway saw ``worker`` die under a request: the core restarts it now (True: a
        restart began; False: a stale report)."""
        self._fleet(service)
        began, commands = self.core.llm_died(service, worker, incarnation, reason, self.clock.now())
        self._feed(commands)
        return began

    def _fleet(self, service: str) -> LlmFleet:
        from failsoft.errors import UnknownNameError

        fleet = self.fleets.get(service)
        if fleet is None:
            raise UnknownNameError(f"no llm service {service!r} (llm services: {', '.join(self.fleets)})")
        return fleet

    async def status(self) -> dict[str, Any]:
        self.state.sync_wall(time.time(), self.clock.now())
        body = self.state.status()
        for server in body["servers"]:
            server["pid"] = self.state.servers[server["name"]].pid
        return {
            "cluster": self.config.name,
            "policy": self.policy,
            "config": self.core.deploys.to_dict(self.state.wall_offset),
            "controller": {"pid": os.getpid(), "restarted": self.restarted, "store": self._store_url},
            "ready": self.core.ready,
            "idle": self.core.idle,  # nothing under way or waiting (a pending warm re-plan included)
            "epoch": self.routes.epoch,
            "version": self.routes.version,
            **body,
            "last_plan": self.core.last_plan,
        }

    async def stats(self) -> dict[str, Any]:
        return {
            "steps": self.steps.to_dict(),
            "heartbeats_total": self.receiver.received,
            "heartbeats_rejected": self.receiver.rejected,
            "heartbeat_max_gap_ms": {s: round(g * 1000, 1) for s, g in self.receiver.max_gap_s.items()},
            "late_ticks": self.late_ticks,
            "operations_running": len(self.core.operations),
            "route_version": self.routes.version,
            "restarted": self.restarted,
        }

    async def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "restarted": self.restarted,
            "epoch": self.routes.epoch,
            "ready": self.core.ready,
        }

    # the loop -----------------------------------------------------------------------------------
    async def _main(self) -> None:
        spawn(self._start(), "controller-start", self.tasks)
        spawn(self._persist_loop(), "controller-persist", self.tasks)
        for name, fleet in self.fleets.items():
            spawn(fleet.run(), f"llm-fleet-{name}", self.tasks)
            spawn(self._place_llm(fleet), f"llm-place-{name}", self.tasks)
        while True:
            await self.steps.run("health", self._check_health, slow_s=self.config.heartbeat.interval_s)
            await self.clock.sleep(self.tick_s)

    def _check_health(self) -> None:
        """Judge every server at ``now`` on every heartbeat that arrived before ``now``.

        ``now`` is read *before* the socket is drained, so every datagram the kernel received by
        then is counted, with its kernel arrival time: a late tick (a stalled loop) only delays the
        verdict, it never makes a live server look silent.
        """
        now = self.clock.now()
        self.state.sync_wall(time.time(), now)
        for beat in self.receiver.drain():
            self._on_beat(beat)
        lag, self._last_check = now - self._last_check, now
        if lag > max(self.core.detector.interval_s, 4 * self.tick_s):
            self.late_ticks += 1  # reported in stats(): how often the loop itself was late
        self._feed(self.core.check_health(now))

    async def _persist_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self.store is None or not self._started:
                continue  # a fresh state written now would overwrite the one to resume from
            self.state.sync_wall(time.time(), self.clock.now())
            docs = {
                **self.state.to_docs(),
                "meta": {"controller": self._meta()},
                "deployment": {"current": scenario_to_dict(self.state.deployment)},
            }
            store = self.store
            await self.steps.run("persist", functools.partial(asyncio.to_thread, store.write, docs))
            await self.clock.sleep(0.01)

    def _meta(self) -> dict[str, Any]:
        # a resumed state stays deployed while it is verified: dying again meanwhile must not redeploy
        deployed = self.core.ready or self._resumed
        return {
            "digest": self.digest,
            "version": self.routes.version,
            "deployed": deployed,
            "config_version": self.core.deploys.version,
            "config_digest": self.core.deploys.digest,
            "policy": self.policy,
            "replan_delay_s": self.core.settings.replan_delay_s,
        }

    # start: deploy, or resume after a crash --------------------------------------------------------
    async def _start(self) -> None:
        """Deploy, or resume; retried every second while the store does not answer (the gateway
        serves on its last table meanwhile, and the agents keep what they hold)."""
        while True:
            try:
                if self.store is None:
                    self.store = await asyncio.to_thread(self._open_store)
                if not (self.restarted and await self._resume(self.store)):
                    await asyncio.to_thread(self.store.clear)
                    self._started = True
                    self._feed(self.core.deploy(self.clock.now()))
                return
            except StoreError as exc:
                log.warning("controller start: %s; retrying in 1 s", exc)
            except Exception:
                log.exception("controller start failed; retrying in 1 s")
            await self.clock.sleep(1.0)

    async def _resume(self, store: Store) -> bool:
        docs = await asyncio.to_thread(store.read)
        meta = docs.get("meta", {}).get("controller", {})
        if meta.get("digest") != self.digest or not meta.get("deployed"):
            log.warning("no usable state in %s: deploying afresh", store.url)
            return False
        self.state.sync_wall(time.time(), self.clock.now())
        self.routes.version = int(meta.get("version", 0))  # the next publish goes past the stored one
        self._resume_deployed(docs, meta)
        self._started = self._resumed = True
        self._feed(self.core.resume(docs, self.clock.now()))
        log.info("resuming from %s at route version %d", store.url, self.routes.version)
        return True

    def _resume_deployed(self, docs: dict[str, Any], meta: dict[str, Any]) -> None:
        """The deployed config, not the first: a deploy's deployment, policy and config version."""
        stored = docs.get("deployment", {}).get("current")
        if stored is not None:
            self.state.reset_deployment(scenario_from_dict(stored, source=f"{self._store_url} (deployment)"))
        self.core.deploys.version = int(meta.get("config_version", 1))
        self.core.deploys.digest = meta.get("config_digest")
        policy = meta.get("policy", self.policy)
        if policy != self.policy:
            self.policy, self.planner = policy, Planner(policy)
            self.driver.planner = self.planner
        delay = meta.get("replan_delay_s")
        if delay is not None:
            self.core.settings = dataclasses.replace(self.core.settings, replan_delay_s=float(delay))
            self.core.operations.settings = self.core.settings


class _LlmReports:
    """What the fleets report, fed to the core at the controller clock's now."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller

    def started(self, service: str, worker: str, incarnation: int, phase: str, info: dict[str, Any]) -> None:
        c = self.c
        c._feed(c.core.llm_started(service, worker, incarnation, phase, c.clock.now(), info))

    def start_failed(self, service: str, worker: str, incarnation: int, error: str) -> None:
        c = self.c
        c._feed(c.core.llm_start_failed(service, worker, incarnation, error, c.clock.now()))

    def died(self, service: str, worker: str, incarnation: int, reason: str) -> bool:
        c = self.c
        began, commands = c.core.llm_died(service, worker, incarnation, reason, c.clock.now())
        c._feed(commands)
        return began

    def standby_lost(self, service: str, server: str, reason: str) -> None:
        c = self.c
        c._feed(c.core.llm_standby_lost(service, server, reason, c.clock.now()))


def _digest(config: RuntimeConfig, deployment: Scenario) -> str:
    """Identifies a deployment: a stored state is resumed only by a controller of the same one."""
    parts = [
        config.name,
        config.policy,
        repr(deployment.servers),
        repr(deployment.apps),
        repr(deployment.policy),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
