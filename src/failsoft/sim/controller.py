"""The simulator's driver of the orchestration core: the runtime's controller, on SimPy time.

Every decision is the core's (:class:`~failsoft.orchestration.Orchestrator`), the same object the
runtime's controller drives, with the same policies and the same failure detector; this driver
carries its commands out on simulated servers and feeds the outcomes back:

* heartbeats of the :class:`~failsoft.sim.agent.SimAgent` go to :meth:`Orchestrator.heartbeat`
  (each agent's latest, worked out by a :class:`~failsoft.sim.heartbeats.HeartbeatFeed` right before
  a check); every ``check_interval_s`` (FailLite's controller: 100 ms, failsoft's runtime: 5 ms)
  :meth:`Orchestrator.check_health` judges them;
* a ``Load`` is a SimPy process on the server's agent taking the variant's profiled ``load_ms``
  (after any unload the core issued to that server, which takes ``unload_ms``); which loads run at
  once, in what order, is the core's per-server load queue (``load_slots`` at a time, by priority);
* a ``PlanFailover`` runs the policy at once (its measured wall time is charged to simulated time
  with ``charge_plan_time``), or after ``plan_wait_ms`` as the cluster is then (a failure that
  arrived meanwhile joins it, as in the runtime's driver: ``failover_plan_starting``);
* a ``Publish`` switches each changed app's serving instance (the request core), and, where the
  app moved to another server, tells its client after ``notify_ms`` (FailLite 5.8: ~10 ms);
* the core's timers (suspect waits, drains, back-offs) become SimPy timeouts;
* an ``llm`` service's worker commands are the runtime ``LlmFleet``'s twin: a ``StartLlmWorker``
  takes the worker's measured load time (the draft's under progressive recovery, none where a
  standby that holds the draft adopts it, else the target's,
  from :class:`~failsoft.orchestration.llm_state.LlmGroup`), a ``SwitchLlmTarget`` the target's
  after that, and each is reported to the core as the fleet reports it (``llm_started``; a server
  that crashed meanwhile: ``llm_start_failed``). Every LLM command is kept, with its time, in
  :attr:`SimController.llm_commands` (``bench fidelity``-style comparisons read it).

A model lost on a live server (:meth:`SimController.model_lost`, :func:`~failsoft.sim.simulate_model_loss`)
reaches the core as the runtime's gateway reports it, at once, and is carried out as above.

What the simulator does not do (the runtime does): servers coming back (restores), re-planning warm
backups after a failure, and the periodic inspection of what servers hold. The event ends when the
core has nothing left to do, or ``horizon_s`` after the failure.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import simpy

from failsoft.domain import ActionKind, Scenario, Variant
from failsoft.orchestration import (
    ClusterState,
    Command,
    CopyRequest,
    Emit,
    Inspect,
    Load,
    OrchestrationSettings,
    Orchestrator,
    PlanFailover,
    Planned,
    PlanProactive,
    Publish,
    Unload,
)
from failsoft.orchestration.commands import LlmCommand, StartLlmWorker, SwitchLlmTarget
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.orchestration.loads import INFERENCE_NICE
from failsoft.policies.failover.interface import FailoverPolicy
from failsoft.sim.agent import SimAgent
from failsoft.sim.config import SimConfig
from failsoft.sim.heartbeats import HeartbeatFeed
from failsoft.sim.metrics import Recorder
from failsoft.sim.requests import RequestCore
from failsoft.sim.trace import EventLog

Process = Generator[simpy.Event, Any, None]
_SWITCHES = ("warm", "promoted")  # failovers to a loaded copy (a warm backup, a pinned copy)


def sim_settings(config: SimConfig) -> OrchestrationSettings:
    """The core's settings for a simulated event: the runtime's rules with the simulator's timing."""
    return OrchestrationSettings(
        heartbeat_interval_s=config.heartbeat_interval_s,
        missed_to_fail=config.missed_to_fail,
        load_slots=config.load_slots,
        heavy_load_slots=config.heavy_load_slots,
        heavy_loads_per_host=config.heavy_loads_per_host,
        drain_s=config.drain_ms / 1000.0,
        replan_warm=False,  # not simulated: an ILP per event would dominate the sweeps
        reconcile_s=None,  # nothing is lost in simulation: reconcile on changes only
        gc_s=None,
    )


class SimController:
    """Drives the orchestration core for one simulated failure event."""

    def __init__(
        self,
        env: simpy.Environment,
        policy: FailoverPolicy,
        scenario: Scenario,
        agents: Mapping[str, SimAgent],
        config: SimConfig,
        recorder: Recorder,
        requests: RequestCore | None,
        log: EventLog,
        heartbeats: HeartbeatFeed,
    ) -> None:
        self.env, self.policy, self.agents, self.heartbeats = env, policy, agents, heartbeats
        self.config, self.recorder, self.requests, self.log = config, recorder, requests, log
        self.state = ClusterState.deployed(scenario)
        self.core = Orchestrator(self.state, sim_settings(config), env.now)
        self.core.assume_deployed(env.now)
        self.client_server: dict[str, str | None] = {
            a.name: a.primary.server for a in scenario.apps if a.primary is not None
        }
        self.undetected: set[str] = set()  # injected, not yet detected
        self.injecting = True  # failures may still be injected
        self.stopped = False
        self.inflight = 0  # loads, charged plans and notifications under way
        self._wakes: set[float] = set()
        self._answering: set[str] = set()  # apps whose first request on the new route was sent
        self._changed = env.event()
        self._end_at = float("inf")
        self._tail = False  # the heartbeats' end is scheduled
        self.llm_commands: list[tuple[float, LlmCommand]] = []  # (time, command), in order
        self.llm_events: list[dict[str, Any]] = []  # the llm-* events, with their time (``at_s``)

    # heartbeats and health ------------------------------------------------------------------------
    def heartbeat(self, server: str, now: float) -> None:
        commands = self.core.heartbeat(server, now)
        if commands:
            self._run(commands)

    def _check_health(self) -> None:
        """The heartbeats sent by now, then the detector's verdicts."""
        self.heartbeats.catch_up(self.env.now, self.heartbeat)
        self._run(self.core.check_health(self.env.now))

    def _deaf(self) -> None:
        """Nobody listens any more: the agents' heartbeat processes would have ended at their next
        heartbeat; the event lasts until then, as it did when each heartbeat was a SimPy event."""
        self._tail = True
        self.env.timeout(max(self.heartbeats.tail_s(self.env.now) - self.env.now, 0.0))

    def listening(self) -> bool:
        """Whether agents keep pushing heartbeats (they cannot change anything once all is detected)."""
        if self.stopped:
            return False
        return self.config.heartbeats_after_detection or self.injecting or bool(self.undetected)

    def injected(self, servers: list[str], done: bool) -> None:
        for server in servers:
            self.heartbeats.crashed(server, self.env.now)
        self.undetected.update(servers)
        self.injecting = not done
        if done:
            self._end_at = self.env.now + self.config.horizon_s

    def health_loop(self, phase_s: float) -> Process:
        """Process: check health every ``check_interval_s`` until every failure is detected, then
        wait until the core has nothing left to do (or the horizon)."""
        interval = self.config.check_interval_s
        k, first = self._quiet_until_failure(phase_s, interval)
        if first is not None:
            yield self.env.timeout(first - self.env.now)
            self._check_health()
        while self.injecting or self.undetected:
            k += 1
            while phase_s + k * interval < self.env.now:
                k += 1
            yield self.env.timeout(phase_s + k * interval - self.env.now)
            self._check_health()
        while not self._done():
            yield self._changed

    def _quiet_until_failure(self, phase_s: float, interval: float) -> tuple[int, float | None]:
        """Skip the checks before the failure: every server heartbeats on time then and the core has
        no timer, so none of them can change anything (they were 9 in 10 of a sweep's checks).
        Returns the first check after the failure (its number, and its time computed as the
        check-by-check waits would have: each wait's float sum), or ``(0, None)`` when the core has
        work of its own to do before the failure."""
        if self.core.next_wakeup() is not None or self.env.now != 0.0:
            return 0, None
        k, at = 0, 0.0
        while True:
            k += 1
            due = phase_s + k * interval
            nxt = at + (due - at) if due > at else at
            if nxt > self.config.failure_at_s:
                return k, nxt
            at = nxt

    def _done(self) -> bool:
        """Nothing can happen any more before the horizon: no process under way, no wake-up due."""
        return self.inflight == 0 and not self._wakes

    def stop(self) -> None:
        self.stopped = True
        if not self._tail:
            self._deaf()

    # a mechanism's copies (the runtime's gateway asks its controller; a simulated one asks here) ---
    def pin(self, request: CopyRequest) -> str:
        """Pin a copy as the runtime's ``Controller.pin`` does: the core's Load, carried out here."""
        server, commands = self.core.pin(request, self.env.now)
        self._run(commands)
        return server

    def unpin(self, app: str, server: str, owner: str) -> None:
        self._run(self.core.unpin(app, server, owner, self.env.now))

    def model_lost(self, app: str, server: str) -> None:
        """``server`` lives on but loses ``app``'s routed model now, and the gateway's next call
        for it reports the loss at once (the runtime's ``report_model_lost``, ``cause`` ``call``):
        the model leaves the agent (its memory freed, as ``failsoft chaos evict`` does) and the core
        decides what follows (:meth:`Orchestrator.model_lost`: promote a pinned copy, switch to a
        warm backup, else reload in place, each carried out here as any command is)."""
        route = self.state.apps[app].route
        assert route is not None and route.server == server, f"{app} is not routed to {server}"
        self.agents[server].unload(app, self.state.variant(app, route.variant))
        if self.requests is not None:
            self.requests.lose(app, server)
        self.injected([], done=True)
        self._run(self.core.model_lost(app, server, route.variant, self.env.now, "call"))

    # llm services' workers (the runtime's fleet reports; here their simulated twins) -------------
    def place_llm(self, group: LlmGroup) -> None:
        """Place an ``llm`` service's workers as the runtime's controller does at start."""
        self._run(self.core.place_llm(group, self.env.now))

    def llm_worker_died(self, service: str, worker: str, reason: str = "killed") -> bool:
        """A worker's process dies (its server lives): the proof the runtime's probe gives."""
        incarnation = self.state.llm.workers[(service, worker)].incarnation
        began, commands = self.core.llm_died(service, worker, incarnation, reason, self.env.now)
        self._run(commands)
        return began

    def _llm(self, cmd: LlmCommand) -> None:
        self.llm_commands.append((self.env.now, cmd))
        if isinstance(cmd, StartLlmWorker | SwitchLlmTarget):
            self.inflight += 1
            self.env.process(self._llm_load(cmd))

    def _llm_load(self, cmd: StartLlmWorker | SwitchLlmTarget) -> Process:
        group = self.state.llm.groups[cmd.service]
        draft = isinstance(cmd, StartLlmWorker) and cmd.draft_first
        preloaded = draft and isinstance(cmd, StartLlmWorker) and cmd.standby  # the standby holds it
        load_s = (0.0 if preloaded else group.draft_load_s) if draft else group.target_load_s
        yield self.env.timeout(load_s)
        self.inflight -= 1
        server = self.state.llm.workers[(cmd.service, cmd.worker)].server
        now = self.env.now
        if server in self.agents and not self.agents[server].alive:
            error = f"server {server} crashed"
            self._run(self.core.llm_start_failed(cmd.service, cmd.worker, cmd.incarnation, error, now))
        else:
            phase = "draft" if draft else "serving"
            info = {"load_ms": round(load_s * 1000.0, 3)}
            self._run(self.core.llm_started(cmd.service, cmd.worker, cmd.incarnation, phase, now, info))

    # carrying out commands ---------------------------------------------------------------------------
    def _run(self, commands: list[Command]) -> None:
        queue = list(commands)
        while queue:
            command = queue.pop(0)
            if isinstance(command, Load):
                self.inflight += 1
                self.env.process(self._load(command))
            elif isinstance(command, Unload):
                variant = self.state.variant(command.app, command.variant)
                self.agents[command.server].unload(command.app, variant)
            elif isinstance(command, Publish):
                self._publish(command.apps)
            elif isinstance(command, Emit):
                self._record(command)
            elif isinstance(command, Planned):
                self._planned(command)
            elif isinstance(command, PlanFailover):
                queue.extend(self._plan(command))
            elif isinstance(command, PlanProactive):
                plan = self.policy.plan_proactive(command.scenario)
                queue.extend(self.core.proactive_planned(command.plan_id, plan, self.env.now))
            elif isinstance(command, Inspect):
                report = {"models": sorted(self.agents[command.server].models)}
                queue.extend(self.core.inspected(command.server, command.purpose, report, self.env.now))
            else:
                self._llm(command)
        self._schedule_wake()
        self._changed.succeed()
        self._changed = self.env.event()

    def _load(self, cmd: Load) -> Process:
        agent = self.agents[cmd.server]
        variant = self.state.variant(cmd.app, cmd.variant)
        ok = yield self.env.process(agent.load(cmd.app, variant, cmd.background))
        self.inflight -= 1
        error = None if ok else f"load of {cmd.variant} on {cmd.server} failed"
        info = {"load_ms": agent.load_ms(variant, cmd.background)}
        self._run(self.core.load_done(cmd.load_id, ok, self.env.now, info=info, error=error))

    def _plan(self, cmd: PlanFailover) -> list[Command]:
        if self.config.plan_wait_ms > 0:  # the policy runs after the wait, as the runtime's planner
            self.inflight += 1
            self.env.process(self._waited(cmd))
            return []
        plan = self.policy.plan_failover(cmd.scenario, cmd.failed)
        wait_ms = plan.plan_ms if self.config.charge_plan_time else 0.0
        if wait_ms <= 0:
            return self.core.failover_planned(cmd.plan_id, plan, self.env.now)
        self.inflight += 1
        self.env.process(self._charged(cmd.plan_id, plan, wait_ms))
        return []

    def _waited(self, cmd: PlanFailover) -> Process:
        """The plan after ``plan_wait_ms``, as the cluster is then (failures meanwhile join it)."""
        yield self.env.timeout(self.config.plan_wait_ms / 1000.0)
        cmd = self.core.failover_plan_starting(cmd.plan_id) or cmd
        plan = self.policy.plan_failover(cmd.scenario, cmd.failed)
        yield from self._charged(cmd.plan_id, plan, plan.plan_ms if self.config.charge_plan_time else 0.0)

    def _charged(self, plan_id: int, plan: Any, wait_ms: float) -> Process:
        if wait_ms > 0:
            yield self.env.timeout(wait_ms / 1000.0)
        self.inflight -= 1
        self._run(self.core.failover_planned(plan_id, plan, self.env.now))

    def _schedule_wake(self) -> None:
        at = self.core.next_wakeup()
        if at is None or at in self._wakes or at >= self._end_at:
            return
        self._wakes.add(at)
        self.env.process(self._wake(at))

    def _wake(self, at: float) -> Process:
        yield self.env.timeout(max(at - self.env.now, 0.0))
        self._wakes.discard(at)
        if self.listening():  # the runtime judges health at every tick; a wake-up is one
            self._check_health()
        else:
            self._run(self.core.advance(self.env.now))

    # what the commands mean for the simulated clients and the records ------------------------------
    def _publish(self, apps: tuple[str, ...]) -> None:
        now = self.env.now
        for app in apps:
            rec = self.state.apps[app]
            if rec.route is None:  # its client learns it has no route and waits for a new one
                self.client_server[app] = None
                continue
            variant = self.state.variant(app, rec.route.variant)
            if app in self.recorder.result.apps:
                self.recorder.serving(app, variant.name, now, final=rec.final is None)
            if self.requests is not None:
                self.requests.serve(app, rec.route.server, variant)
            self.log.add(now, "serving", app, rec.route.server, variant.name)
            if self.config.first_answer and app in self.recorder.result.apps and app not in self._answering:
                self._answering.add(app)
                self.inflight += 1
                self.env.process(self._first_answer(app, rec.route.server, variant))
            if self.client_server.get(app) != rec.route.server:
                self.client_server[app] = rec.route.server
                self.inflight += 1
                self.env.process(self._notify(app, rec.route.server))

    def _first_answer(self, app: str, server: str, variant: Variant) -> Process:
        """The request that waited for the new route: one batch-1 inference there, at the runtime's
        inference priority on a shared host."""
        yield from self.agents[server].work(variant.latency_ms / 1000.0, INFERENCE_NICE)
        self.inflight -= 1
        if self.agents[server].alive:
            self.recorder.answered(app, self.env.now)
        self._changed.succeed()
        self._changed = self.env.event()

    def _notify(self, app: str, server: str) -> Process:
        yield self.env.timeout(self.config.notify_ms / 1000.0)
        self.inflight -= 1
        if self.agents[server].alive:
            if app in self.recorder.result.apps:
                self.recorder.notified(app, self.env.now)
            if self.requests is not None:
                self.requests.notify(app, server)
            self.log.add(self.env.now, "notified", app, server, "")
        self._changed.succeed()
        self._changed = self.env.event()

    def _record(self, cmd: Emit) -> None:
        f = cmd.fields
        if cmd.type.startswith("llm-"):
            self.llm_events.append({"type": cmd.type, "at_s": self.env.now, **f})
        if cmd.type == "detected":
            self.recorder.detected(f["server"], f["detected_at"])
            self.undetected.discard(f["server"])
            if not self.listening() and not self._tail:
                self._deaf()
            self.log.add(f["detected_at"], "detected", "", f["server"], "")
        elif cmd.type == "failure" and f.get("app") is not None:
            self.recorder.affected(f["app"], f["server"], f["detected_at"])
        elif cmd.type == "model_lost":
            self.recorder.affected(f["app"], f["server"], f["detected_at"])
            self.log.add(f["detected_at"], "lost", f["app"], f["server"], f["variant"])
        elif cmd.type == "failover" and f.get("app") in self.recorder.result.apps:
            self.recorder.recovered_by(f["app"], f["kind"])
            if f["kind"] in _SWITCHES:  # switched before any plan
                self.recorder.failover(f["app"], ActionKind.WARM, f["server"])
            elif f["kind"] == "reload":  # a model lost on a live server, loaded again in place
                self.recorder.failover(f["app"], ActionKind.COLD, f["server"])

    def _planned(self, cmd: Planned) -> None:
        self.recorder.planned(cmd.plan, cmd.applied)
        self.log.add(cmd.at, "plan", "", ",".join(cmd.plan.failed), cmd.plan.policy)
        for backup in cmd.plan.released:
            self.log.add(cmd.at, "release", backup.app, backup.server, backup.variant)
