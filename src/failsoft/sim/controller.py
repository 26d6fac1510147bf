"""The SimPy twin of the runtime controller: health checks, policy calls, plan application.

It does what FailLite's controller does (3.4, 4) and what failsoft's runtime controller does, with
the *same* policy objects and the *same* failure detector:

1. every ``check_interval_s`` it advances the
   :class:`~failsoft.policies.detection.HeartbeatDetector` (fed by the agents' heartbeats) to the
   current simulated time, read through a :class:`~failsoft.sim.clock.SimClock`;
2. when servers turn ``failed``, it builds a :class:`~failsoft.domain.Scenario` snapshot (each
   app's ``primary`` is where it is served now, or where its recovery is heading; ``warm`` the live
   warm backups) and calls ``policy.plan_failover(snapshot, failed)``;
3. it applies the :class:`~failsoft.domain.FailoverPlan`: first it unloads the ``released`` warm
   backups, then, per action, a **warm** switch (the client is notified), a **cold** load of the
   final variant, or a **progressive** load of ``first_variant`` (served, client notified) followed
   by the upgrade to ``final_variant`` in the background, one upgrade at a time per server, the
   server switching the app's instance in place and unloading the small variant.

Correlated failures are planned together: when a check finds failed servers while others are
*suspect* (one heartbeat missed), the controller re-checks when those suspects must have been heard
from or failed (``SimConfig.settle_suspects``; at most one heartbeat interval later), so a site
failure is one plan. Servers detected in a later check trigger another plan over all failed servers;
apps left unrecovered earlier are affected again and may be recovered then. Such a later plan sees
apps in recovery at their final variant; the small variant a server still holds until its upgrade
is invisible to it (a scenario has one placement per app), which may make an upgrade or a new load
fail for lack of memory (counted as ``oom_loads``). Nothing here decides *where* or *which
variant*: that is the policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping
from typing import Any

import simpy

from failsoft.domain import ActionKind, FailoverAction, FailoverPlan, Placement, ServerState, WarmBackup
from failsoft.policies.detection import HeartbeatDetector
from failsoft.policies.failover.interface import FailoverPolicy
from failsoft.sim.agent import RECOVERY, UPGRADE, SimAgent
from failsoft.sim.clock import SimClock
from failsoft.sim.config import SimConfig
from failsoft.sim.metrics import Recorder
from failsoft.sim.requests import RequestCore
from failsoft.sim.trace import EventLog

Process = Generator[simpy.Event, Any, None]
_TICK_S = 1e-6  # just past a deadline: the detector fails a server strictly after it


class SimController:
    """Cluster state, failure detection and plan application for one simulated event."""

    def __init__(
        self,
        env: simpy.Environment,
        policy: FailoverPolicy,
        scenario,
        agents: Mapping[str, SimAgent],
        config: SimConfig,
        recorder: Recorder,
        requests: RequestCore | None,
        log: EventLog,
    ) -> None:
        self.env, self.policy, self.base, self.agents = env, policy, scenario, agents
        self.config, self.recorder, self.requests, self.log = config, recorder, requests, log
        self.clock = SimClock(env)
        self.detector = HeartbeatDetector(config.heartbeat_interval_s, config.missed_to_fail)
        for name in agents:
            self.detector.register(name, self.clock.now())
        self.apps = {a.name: a for a in scenario.apps}  # primary = where served now, or heading
        self.warm: list[WarmBackup] = list(scenario.warm or ())
        self.failed: list[str] = []
        self.undetected: set[str] = set()  # injected, not yet detected
        self.injecting = True  # failures may still be injected
        self.stopped = False
        self.work: list[simpy.Process] = []

    # heartbeats and health ---------------------------------------------------------------------
    def heartbeat(self, server: str, now: float) -> None:
        self.detector.heartbeat(server, now)

    def listening(self) -> bool:
        """Whether agents keep pushing heartbeats (they cannot change anything once all is detected)."""
        if self.stopped:
            return False
        return self.config.heartbeats_after_detection or self.injecting or bool(self.undetected)

    def injected(self, servers: list[str], done: bool) -> None:
        self.undetected.update(servers)
        self.injecting = not done

    def health_loop(self, phase_s: float) -> Process:
        """Process: check health every ``check_interval_s``; recover what failed; wait for recoveries."""
        interval = self.config.check_interval_s
        k = 0
        while self.injecting or self.undetected:
            k += 1
            while phase_s + k * interval < self.env.now:  # a charged plan outlasted check periods
                k += 1
            yield self.env.timeout(phase_s + k * interval - self.env.now)
            failed = self._check()
            if failed and self.config.settle_suspects:
                failed += yield from self._settle()
            if failed:
                yield from self._on_failed(failed)
        while pending := [p for p in self.work if p.is_alive]:
            yield simpy.AllOf(self.env, pending)

    def _check(self) -> list[str]:
        changes = self.detector.check(self.clock.now())
        return [c.server for c in changes if c.new is ServerState.FAILED]

    def _settle(self) -> Generator[simpy.Event, Any, list[str]]:
        """Wait until no server is suspect, so that correlated failures are planned together.

        When a site goes dark its servers stop at once but their last heartbeats straddle the
        check: some are failed, the rest already suspect. A suspect is failed or heard from within
        ``missed_to_fail`` intervals of its last heartbeat, so waiting that long (at most one
        interval past the detection) lets one plan cover them all.
        """
        failed: list[str] = []
        limit = self.config.missed_to_fail * self.config.heartbeat_interval_s
        while suspects := [s for s, st in self.detector.states().items() if st is ServerState.SUSPECT]:
            deadline = max(self.detector.last_heartbeat(s) for s in suspects) + limit
            yield self.env.timeout(max(deadline - self.env.now, 0.0) + _TICK_S)
            failed += self._check()
        return failed

    def stop(self) -> None:
        self.stopped = True

    # planning ------------------------------------------------------------------------------------
    def snapshot(self):
        """The scenario the policy sees: current locations and live warm backups."""
        return self.base.replace(apps=tuple(self.apps[a.name] for a in self.base.apps), warm=tuple(self.warm))

    def _on_failed(self, servers: list[str]) -> Process:
        now = self.clock.now()
        for server in servers:
            self.recorder.detected(server, now)
            self.undetected.discard(server)
            self.log.add(now, "detected", "", server, "")
        self.failed.extend(servers)
        down = set(self.failed)
        self.warm = [b for b in self.warm if b.server not in down]
        for app in self.apps.values():
            if app.primary is not None and app.primary.server in down:
                self.recorder.affected(
                    app.name, app.primary.server, self.recorder.result.detected_at[app.primary.server]
                )
        plan = self.policy.plan_failover(self.snapshot(), self.failed)
        self.recorder.planned(plan)
        self.log.add(now, "plan", "", ",".join(plan.failed), plan.policy)
        if self.config.charge_plan_time:
            yield self.env.timeout(plan.plan_ms / 1000.0)
        self._apply(plan)

    def _apply(self, plan: FailoverPlan) -> None:
        for backup in plan.released:  # unload released warm backups before any load
            self.warm.remove(backup)
            app = self.base.app(backup.app)
            self.agents[backup.server].unload(backup.app, self.base.variant_of(app, backup.variant))
            self.log.add(self.env.now, "release", backup.app, backup.server, backup.variant)
        delay = self.config.unload_ms / 1000.0 if plan.released else 0.0
        for action in plan.actions:
            app = self.apps[action.app]
            self.apps[action.app] = dataclasses.replace(
                app, primary=Placement(action.server, action.final_variant)
            )
            if action.kind is ActionKind.WARM:
                self.warm.remove(WarmBackup(action.app, action.first_variant, action.server))
            self.work.append(self.env.process(self._recover(action, delay)))

    # recovery ------------------------------------------------------------------------------------
    def _recover(self, action: FailoverAction, delay_s: float) -> Process:
        if delay_s:
            yield self.env.timeout(delay_s)
        app = self.base.app(action.app)
        first = self.base.variant_of(app, action.first_variant)
        is_final = action.first_variant == action.final_variant
        stand_in = action.stand_in_server  # where the first variant serves
        if action.kind is not ActionKind.WARM:
            loaded = yield self.env.process(self.agents[stand_in].load(app.name, first, RECOVERY))
            if not loaded:
                return
        self._serve(app.name, stand_in, first, is_final)
        self.work.append(self.env.process(self._notify(app.name, stand_in)))
        if not is_final:
            yield from self._upgrade(action, first)

    def _upgrade(self, action: FailoverAction, first) -> Process:
        agent = self.agents[action.server]
        final = self.base.variant_of(self.base.app(action.app), action.final_variant)
        if action.stand_in_server != action.server:
            # the small variant stands in elsewhere: load the final one, move the route, then free it
            loaded = yield self.env.process(agent.load(action.app, final, UPGRADE))
            if not loaded:
                return
            self._serve(action.app, action.server, final, True)
            yield self.env.process(self._notify(action.app, action.server))
            self.agents[action.stand_in_server].unload(action.app, first)
            return
        with agent.upgrades.request() as turn:
            yield turn
            loaded = yield self.env.process(agent.load(action.app, final, UPGRADE))
            if not loaded:
                return  # stays on the first variant
            self._serve(action.app, action.server, final, True)
            agent.unload(action.app, first)

    def _serve(self, app: str, server: str, variant, final: bool) -> None:
        self.recorder.serving(app, variant.name, self.env.now, final)
        if self.requests is not None:
            self.requests.serve(app, server, variant)
        self.log.add(self.env.now, "serving", app, server, variant.name)

    def _notify(self, app: str, server: str) -> Process:
        yield self.env.timeout(self.config.notify_ms / 1000.0)
        if not self.agents[server].alive:
            return
        self.recorder.notified(app, self.env.now)
        if self.requests is not None:
            self.requests.notify(app, server)
        self.log.add(self.env.now, "notified", app, server, "")
