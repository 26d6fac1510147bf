"""The controller: one async Ray actor that detects failures and runs FailLite's two steps (3.4, 4).

It holds the cluster's state (:class:`~failsoft.runtime.state.ClusterState`), receives every agent's
heartbeat (UDP datagrams stamped on arrival by a thread, :mod:`failsoft.runtime.heartbeat`), and
drives a control loop that cannot die (:mod:`failsoft.runtime.loop`):

* ``health`` (every few ms): the pure :class:`~failsoft.policies.detection.HeartbeatDetector`
  decides who is up, suspect, failed or recovering; two missed heartbeats make a failure. Arrival
  times are the kernel's, so a stalled loop delays verdicts but never fakes a silence;
* ``failover``: failed servers are handed to the orchestrator, which unroutes their apps at once
  and plans the failover with the configured policy. While another server is *suspect*, the plan
  waits (at most one heartbeat interval) so that a site failure is planned as one;
* ``reconcile`` (every 250 ms): return apps home, retry unrecovered apps, re-plan warm backups;
* ``gc`` (every 2 s): compare agents' holdings with the state; ``persist``: write the state to
  the store whenever it changed.

Routes and events go out by long-poll (:mod:`failsoft.runtime.longpoll`). At start the controller
deploys (primaries, then warm backups from the proactive policy); when Ray restarts it after a
crash, it resumes from the store instead, keeping every model that healthy servers still hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from failsoft.clock import MonotonicClock
from failsoft.domain import Scenario, ServerState
from failsoft.errors import FailsoftError
from failsoft.policies.detection import HealthChange, HeartbeatDetector
from failsoft.runtime import cluster
from failsoft.runtime.config import RuntimeConfig
from failsoft.runtime.heartbeat import Beat, HeartbeatEndpoint, HeartbeatReceiver
from failsoft.runtime.longpoll import EventLog, VersionedValue
from failsoft.runtime.loop import StepRunner, spawn
from failsoft.runtime.orchestrator import Orchestrator
from failsoft.runtime.planner import Planner
from failsoft.runtime.state import ClusterState
from failsoft.runtime.store import open_store

log = logging.getLogger(__name__)
RECONCILE_S = 0.25
GC_S = 2.0
DEPLOY_WAIT_S = 180.0
LONG_AGO_S = 3600.0
GLOBAL_GRACE = 5.0
CONTROLLER_NICE = -5


class Controller:
    """The cluster's brain. Ray runs all its methods on one event loop: no locks around state."""

    def __init__(self, config: RuntimeConfig, deployment: Scenario, heartbeat: HeartbeatEndpoint) -> None:
        cluster.configure_actor_logging()
        self.config = config
        self.state = ClusterState(deployment)
        self.clock = MonotonicClock()
        hb = config.heartbeat
        self.detector = HeartbeatDetector(hb.interval_s, hb.missed_to_fail, pause_grace=True)
        self.tick_s = min(0.005, hb.interval_s / 4)
        self.routes = VersionedValue(self.state.routes())
        self.events = EventLog(epoch=self.routes.epoch)
        self.steps = StepRunner(slow_s=max(hb.interval_s, 0.02))
        self.restarted = cluster.actor_was_restarted()
        self.store = open_store(config.store_url, config.state_dir, config.name)
        self.digest = _digest(config, deployment)
        self.orch = Orchestrator(
            self.state,
            Planner(config.policy),
            config.agents,
            self._agent,
            self._publish,
            self._emit,
            config.replan_delay_s,
        )
        self.ready = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self._agents: dict[str, cluster.AgentRef] = {}
        self._failed_queue: dict[str, float] = {}  # server -> detection wall time
        self._last_heard: dict[str, float] = {}  # server -> wall time of its last heartbeat
        self._heard_again: dict[str, float] = {}  # failed server -> wall time it spoke again
        self._restoring: dict[str, asyncio.Task[Any]] = {}
        self._dirty = asyncio.Event()
        self._last_check = self.clock.now()
        self.late_ticks = 0
        self.receiver = HeartbeatReceiver(heartbeat, set(self.state.servers))
        gc.freeze()  # keep full collections (hundreds of ms over Ray's and numpy's objects) off the loop
        _raise_priority()
        spawn(self._main(), "controller-main", self.tasks)

    # plumbing --------------------------------------------------------------------------------
    def _agent(self, server: str) -> cluster.AgentRef:
        if server not in self._agents:
            self._agents[server] = cluster.find_agent(server)
        return self._agents[server]

    def _publish(self) -> None:
        self.routes.publish(self.state.routes())
        self._dirty.set()

    def _emit(self, event_type: str, **fields: Any) -> None:
        event = self.events.append({"type": event_type, "timestamp": time.time(), **fields})
        log.info("event %s", json.dumps(event, default=str))
        self._dirty.set()

    # heartbeats ------------------------------------------------------------------------------------
    def _on_beat(self, beat: Beat) -> None:
        rec = self.state.servers[beat.server]
        if rec.incarnation is not None and rec.incarnation != beat.incarnation:
            self._agents.pop(beat.server, None)  # a new process (maybe a new actor): look it up again
        if rec.state is None:  # first word from this server
            self.detector.register(beat.server, beat.arrived)
            rec.state, rec.incarnation = ServerState.UP, beat.incarnation
            self._dirty.set()
            return
        if rec.incarnation != beat.incarnation and rec.state in (ServerState.UP, ServerState.SUSPECT):
            # it restarted faster than we noticed: what it held is gone; fail it now, restore next
            rec.incarnation = beat.incarnation
            self.detector.forget(beat.server)
            self.detector.register(beat.server, beat.arrived - LONG_AGO_S)
            return
        rec.incarnation = beat.incarnation
        change = self.detector.heartbeat(beat.server, beat.arrived)
        if change is not None:
            self._on_change(change)

    # API: gateway, CLI, tests ---------------------------------------------------------------------
    async def wait_routes(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        snap = await self.routes.wait_newer(epoch, version, timeout_s)
        return {**snap, "ready": self.ready}

    async def wait_events(self, epoch: str, seq: int, timeout_s: float) -> dict[str, Any]:
        return await self.events.wait_after(epoch, seq, timeout_s)

    async def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.ready

    async def status(self) -> dict[str, Any]:
        body = self.state.status()
        for server in body["servers"]:
            server["pid"] = self.state.servers[server["name"]].pid
        return {
            "cluster": self.config.name,
            "policy": self.config.policy,
            "controller": {"pid": os.getpid(), "restarted": self.restarted, "store": self.store.url},
            "ready": self.ready,
            "epoch": self.routes.epoch,
            "version": self.routes.version,
            **body,
            "last_plan": self.orch.last_plan,
        }

    async def stats(self) -> dict[str, Any]:
        return {
            "steps": self.steps.to_dict(),
            "heartbeats_total": self.receiver.received,
            "heartbeats_rejected": self.receiver.rejected,
            "heartbeat_max_gap_ms": {s: round(g * 1000, 1) for s, g in self.receiver.max_gap_s.items()},
            "late_ticks": self.late_ticks,
            "operations_running": len(self.orch.ops),
            "route_version": self.routes.version,
            "restarted": self.restarted,
        }

    async def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "restarted": self.restarted,
            "epoch": self.routes.epoch,
            "ready": self.ready,
        }

    # the loop -----------------------------------------------------------------------------------
    async def _main(self) -> None:
        spawn(self._start(), "controller-start", self.tasks)
        spawn(self._persist_loop(), "controller-persist", self.tasks)
        next_reconcile = next_gc = 0.0
        while True:
            await self.steps.run("health", self._check_health, slow_s=self.config.heartbeat.interval_s)
            await self.steps.run("failover", self._start_failovers)
            now = self.clock.now()
            if self.ready and now >= next_reconcile:
                next_reconcile = now + RECONCILE_S
                await self.steps.run("reconcile", self._reconcile)
            if self.ready and now >= next_gc:
                next_gc = now + GC_S
                spawn(self.steps.run("gc", self.orch.collect_garbage, slow_s=GC_S), "gc", self.tasks)
            await asyncio.sleep(self.tick_s)

    def _check_health(self) -> None:
        """Judge every server at ``now`` on every heartbeat that arrived before ``now``.

        ``now`` is read *before* the socket is drained, so every datagram the kernel received by
        then is counted, with its kernel arrival time: a late tick (a stalled loop) only delays the
        verdict, it never makes a live server look silent.
        """
        now = self.clock.now()
        for beat in self.receiver.drain():
            self._on_beat(beat)
        lag, self._last_check = now - self._last_check, now
        if lag > max(self.detector.interval_s, 4 * self.tick_s):
            self.late_ticks += 1  # reported in stats(): how often the loop itself was late
        if self._nobody_heard(now):
            return
        for change in self.detector.check(now):
            self._on_change(change)

    def _nobody_heard(self, now: float) -> bool:
        """Every live server silent at once, briefly: more likely our own stall than theirs.

        Failures are then held back until the silence exceeds ``GLOBAL_GRACE`` thresholds (a whole
        cluster going dark is still detected, a little later).
        """
        d = self.detector
        live = [s for s, st in d.states().items() if st in (ServerState.UP, ServerState.SUSPECT)]
        if len(live) < 2:
            return False
        silent = now - max(d.last_heartbeat(s) for s in live)
        threshold = d.interval_s * d.missed_to_fail
        return threshold < silent < GLOBAL_GRACE * threshold

    def _on_change(self, change: HealthChange) -> None:
        rec = self.state.servers[change.server]
        if change.new is ServerState.FAILED:
            self._agents.pop(change.server, None)  # a dead actor's handle would keep its name taken
            task = self._restoring.pop(change.server, None)
            if task is not None:
                task.cancel()
            if rec.state is ServerState.FAILED:  # already known (e.g. read back from the store)
                return
            now_wall = time.time()
            self._failed_queue.setdefault(change.server, now_wall)
            self._last_heard[change.server] = now_wall - (self.clock.now() - change.last_heartbeat)
        elif change.new is ServerState.RECOVERING:
            rec.state = ServerState.RECOVERING
            self._heard_again[change.server] = time.time()
            self._restoring[change.server] = spawn(
                self._restore(change.server), f"restore:{change.server}", self.tasks
            )
        elif rec.state is not ServerState.FAILED:
            rec.state = change.new
        self._dirty.set()

    def _start_failovers(self) -> None:
        """Hand queued failures to the orchestrator, once no other server is merely suspect."""
        if not self._failed_queue:
            return
        first = min(self._failed_queue.values())
        suspects = [s for s, st in self.detector.states().items() if st is ServerState.SUSPECT]
        if suspects and time.time() - first < self.detector.interval_s:
            return
        failed, self._failed_queue = self._failed_queue, {}
        self.orch.fail_servers(failed, first, {s: self._last_heard.pop(s, first) for s in failed})
        spawn(self.steps.run("plan", lambda: self.orch.plan_failover(first), slow_s=0.2), "plan", self.tasks)

    async def _restore(self, server: str) -> None:
        try:
            await self.orch.clean_returning(server)
        except FailsoftError as exc:
            log.warning("restore of %s postponed: %s", server, exc)
            await asyncio.sleep(1.0)
            self._restoring.pop(server, None)
            self.detector.forget(server)
            self.detector.register(server, self.clock.now() - LONG_AGO_S)
            self.state.servers[server].state = ServerState.FAILED
            return
        self.detector.mark_up(server, self.clock.now())
        self.state.servers[server].state = ServerState.UP
        self._restoring.pop(server, None)
        self.orch.warm_dirty = True
        # with the failure event's last_heartbeat_at: how long the server was silent (a short
        # silence of a server that then comes back unchanged is a busy server, not a failed one)
        heard_again = self._heard_again.pop(server, None)
        self._emit(
            "server_up", app=None, server=server, variant=None, accuracy=None, heard_again_at=heard_again
        )
        self.orch.reconcile()

    async def _reconcile(self) -> None:
        if self.orch.reconcile() and not self._failed_queue:
            await self.orch.plan_failover(time.time())

    async def _persist_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            docs = {**self.state.to_docs(), "meta": {"controller": self._meta()}}
            await self.steps.run("persist", lambda docs=docs: asyncio.to_thread(self.store.write, docs))
            await asyncio.sleep(0.01)

    def _meta(self) -> dict[str, Any]:
        return {"digest": self.digest, "version": self.routes.version, "deployed": self.ready}

    # start: deploy, or resume after a crash --------------------------------------------------------
    async def _start(self) -> None:
        while True:
            try:
                resumed = self.restarted and await self._resume()
                if not resumed:
                    await self._deploy()
                self.ready = True
                self._publish()
                self._emit("ready", app=None, server=None, variant=None, accuracy=None, resumed=bool(resumed))
                return
            except Exception:
                log.exception("controller start failed; retrying in 1 s")
                await asyncio.sleep(1.0)

    async def _deploy(self) -> None:
        await asyncio.to_thread(self.store.clear)
        deadline = time.monotonic() + DEPLOY_WAIT_S
        while time.monotonic() < deadline and any(r.state is None for r in self.state.servers.values()):
            await asyncio.sleep(0.05)
        now = self.clock.now()
        for name, rec in self.state.servers.items():
            if rec.state is None:  # never came up: planned around, restored if it ever heartbeats
                log.warning("server %s did not start in %.0f s: treated as failed", name, DEPLOY_WAIT_S)
                self.detector.register(name, now - LONG_AGO_S)
        for name, rec in self.state.apps.items():
            if self.state.live(rec.home.server):
                self.orch.return_home(name, event=None)
        while self.orch.ops:
            await asyncio.sleep(0.02)
        await self.orch.replan_warm()
        self.orch.warm_dirty = False

    async def _resume(self) -> bool:
        docs = await asyncio.to_thread(self.store.read)
        meta = docs.get("meta", {}).get("controller", {})
        if meta.get("digest") != self.digest or not meta.get("deployed"):
            log.warning("no usable state in %s: deploying afresh", self.store.url)
            return False
        self.state.load_docs(docs)
        self.routes = VersionedValue(self.state.routes(), version=int(meta.get("version", 0)) + 1)
        self.events = EventLog(epoch=self.routes.epoch)
        now = self.clock.now()
        for name, rec in self.state.servers.items():
            if rec.state in (ServerState.FAILED, ServerState.RECOVERING):
                rec.state = ServerState.FAILED
                self.detector.register(name, now - LONG_AGO_S)
            elif rec.state is not None:
                self.detector.register(name, now)
        await self._verify_holdings()
        log.info("resumed from %s at route version %d", self.store.url, self.routes.version)
        return True

    async def _verify_holdings(self) -> None:
        """Trust the agents, not the store: a route to a model its server no longer holds is dropped."""
        live = [n for n, r in self.state.servers.items() if r.live]
        reports = await asyncio.gather(*(self._agent(n).holdings() for n in live), return_exceptions=True)
        for name, report in zip(live, reports, strict=True):
            rec = self.state.servers[name]
            if isinstance(report, BaseException):
                continue  # the detector will settle it
            rec.holdings = {(a, v) for a, v in report["models"]}
            rec.incarnation, rec.pid = report["incarnation"], report.get("pid")
        for app in self.state.apps.values():
            r = app.route
            if (
                r is not None
                and self.state.live(r.server)
                and (app.app.name, r.variant) not in self.state.servers[r.server].holdings
            ):
                app.route = None
        for key, w in list(self.state.warm.items()):
            if (w.backup.app, w.backup.variant) not in self.state.servers[w.backup.server].holdings:
                del self.state.warm[key]
                self.orch.warm_dirty = True


def _raise_priority(nice: int = CONTROLLER_NICE) -> None:
    """Run the controller's threads ahead of the agents' inference when the OS allows it (root).

    The controller is light but latency-critical: a verdict or a route change it publishes late is
    outage. On a shared machine (an embedded cluster) the agents' model work would otherwise delay
    it by whole scheduler ticks. Without the privilege nothing changes.
    """
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)


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
