"""The runtime's driver of the orchestration core: its commands carried out with Ray and asyncio.

The decisions (what to load where and when, routes, events, re-plans) are the core's
(:mod:`failsoft.orchestration.core`); this driver only does what it is told, on the controller's
event loop, and feeds each outcome back:

* :class:`~failsoft.orchestration.commands.Load`: ``AgentRef.load`` (after any unload still
  running on that server, so the memory a plan released is free before the load asks for it); the
  agent's report of where the load's time went (``phases``: :mod:`~failsoft.runtime.load_phases`)
  gets the driver's stamps beside the agent's, in wall-clock time: when the last failover plan was
  asked for and made (``plan_asked_at``, ``plan_done_at``), when the core sent the load
  (``issued_at``: its slot was free) and when the agent's answer came back (``returned_at``);
* ``Unload``: ``AgentRef.unload``, fire and forget, bounded by a short timeout (a hung server must
  never hold anything up: the core does not wait for unloads);
* ``PlanFailover`` / ``PlanProactive``: the :class:`~failsoft.runtime.planner.Planner` (Algorithm 1
  inline for small clusters, the ILP in a child process); a failover plan as the cluster is when
  the planner starts (``failover_plan_starting``: a failure that arrived meanwhile joins it);
* ``Inspect``: ``AgentRef.holdings``;
* ``Publish`` / ``Emit``: the controller's long-poll values (routes, events). Event times leave the
  core in core time (monotonic seconds) and are turned into wall-clock time here;
* the ``llm`` services' worker commands (``StartLlmWorker``, ``SwitchLlmTarget``, ``StopLlmWorker``,
  ``StartLlmStandby``, ``PublishLlm``): handed to the service's executor
  (:class:`~failsoft.runtime.llm_fleet.LlmFleet`), which reports back to the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from failsoft.clock import AsyncClock, wait_all
from failsoft.errors import FailsoftError
from failsoft.orchestration import (
    Command,
    Emit,
    Inspect,
    Load,
    Orchestrator,
    PlanFailover,
    Planned,
    PlanProactive,
    Publish,
    Unload,
)
from failsoft.orchestration.commands import (
    LlmCommand,
    PublishLlm,
    StartLlmStandby,
    StartLlmWorker,
    StopLlmWorker,
    SwitchLlmTarget,
)
from failsoft.runtime.cluster import AgentRef
from failsoft.runtime.loop import spawn
from failsoft.runtime.planner import Planner

log = logging.getLogger(__name__)
UNLOAD_TIMEOUT_S = 5.0
INSPECT_TIMEOUT_S = 5.0
INTERNAL_EVENTS = frozenset({"detected"})  # the core's own bookkeeping, not for clients
LLM_COMMANDS = (StartLlmWorker, SwitchLlmTarget, StopLlmWorker, StartLlmStandby, PublishLlm)


class CoreDriver:
    """Runs the core's commands; ``feed`` is called with whatever an input of the core returned."""

    def __init__(
        self,
        core: Orchestrator,
        planner: Planner,
        agent: Callable[[str], AgentRef],
        publish: Callable[[], None],
        emit: Callable[[str, dict[str, Any]], None],
        clock: AsyncClock,
        on_detected: Callable[[str], None] = lambda server: None,
        llm: Callable[[LlmCommand], None] = lambda command: None,
    ) -> None:
        self.core, self.planner, self.agent = core, planner, agent
        self.publish, self.emit, self.clock = publish, emit, clock
        self.on_detected = on_detected
        self.llm = llm  # an llm service's worker commands, to its executor
        self.tasks: set[asyncio.Task[Any]] = set()
        self._unloading: dict[str, set[asyncio.Task[Any]]] = {}
        self._plan_stamps: dict[str, float] = {}  # the last failover plan's (wall clock)

    def feed(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, Load):
                issued = {"issued_at": self._wall(), **self._plan_stamps}
                spawn(self._load(command, issued), f"load:{command.app}@{command.server}", self.tasks)
            elif isinstance(command, Unload):
                self._unload(command)
            elif isinstance(command, Publish):
                self.publish()
            elif isinstance(command, Emit):
                self._emit(command)
            elif isinstance(command, PlanFailover):
                spawn(self._plan_failover(command), "plan-failover", self.tasks)
            elif isinstance(command, PlanProactive):
                spawn(self._plan_proactive(command), "plan-proactive", self.tasks)
            elif isinstance(command, Inspect):
                spawn(self._inspect(command), f"inspect:{command.server}", self.tasks)
            elif isinstance(command, Planned):
                log.info("failover plan applied: %s", command.plan.to_dict())
            elif isinstance(command, LLM_COMMANDS):
                self.llm(command)

    # commands ---------------------------------------------------------------------------------
    async def _load(self, cmd: Load, stamps: dict[str, float]) -> None:
        pending = self._unloading.get(cmd.server)
        if pending:  # the memory the load needs may be what those unloads free
            await wait_all(self.clock, pending, UNLOAD_TIMEOUT_S)
        try:
            info = await self.agent(cmd.server).load(cmd.app, cmd.family, cmd.variant, cmd.background)
        except FailsoftError as exc:
            self.feed(self.core.load_done(cmd.load_id, False, self.clock.now(), error=str(exc)))
            return
        if info.get("phases"):  # a load done now, not one the agent already held
            info = info | {"phases": {**stamps, **info["phases"], "returned_at": self._wall()}}
        self.feed(self.core.load_done(cmd.load_id, True, self.clock.now(), info=info))

    def _wall(self) -> float:
        """Now, in wall-clock seconds (as the core's event times are emitted)."""
        return self.clock.now() + self.core.state.wall_offset

    def _unload(self, cmd: Unload) -> None:
        task = spawn(self._run_unload(cmd), f"unload:{cmd.app}@{cmd.server}", self.tasks)
        pending = self._unloading.setdefault(cmd.server, set())
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def _run_unload(self, cmd: Unload) -> None:
        try:
            await self.agent(cmd.server).unload(cmd.app, cmd.variant, timeout_s=UNLOAD_TIMEOUT_S)
        except FailsoftError as exc:  # a dead server holds nothing worth unloading; gc checks later
            log.info("unload of %s/%s on %s skipped: %s", cmd.app, cmd.variant, cmd.server, exc)

    async def _plan_failover(self, cmd: PlanFailover) -> None:
        asked = self._wall()
        cmd = self.core.failover_plan_starting(cmd.plan_id) or cmd  # failures since it was asked join it
        try:
            plan = await self.planner.failover(cmd.scenario, cmd.failed)
            self._plan_stamps = {"plan_asked_at": asked, "plan_done_at": self._wall()}
        except Exception as exc:  # the core must hear of every outcome, or it waits for this plan forever
            _log_planning_error("failover", exc)
            self.feed(self.core.failover_planned(cmd.plan_id, None, self.clock.now(), error=str(exc)))
            return
        self.feed(self.core.failover_planned(cmd.plan_id, plan, self.clock.now()))

    async def _plan_proactive(self, cmd: PlanProactive) -> None:
        try:
            plan = await self.planner.proactive(cmd.scenario)
        except Exception as exc:  # as above: a failed plan is reported, and planned again later
            _log_planning_error("proactive", exc)
            self.feed(self.core.proactive_planned(cmd.plan_id, None, self.clock.now(), error=str(exc)))
            return
        self.feed(self.core.proactive_planned(cmd.plan_id, plan, self.clock.now()))

    async def _inspect(self, cmd: Inspect) -> None:
        try:
            report = await self.agent(cmd.server).holdings(timeout_s=INSPECT_TIMEOUT_S)
        except FailsoftError as exc:
            log.info("inspection of %s (%s) failed: %s", cmd.server, cmd.purpose, exc)
            report = None
        self.feed(self.core.inspected(cmd.server, cmd.purpose, report, self.clock.now()))

    def _emit(self, cmd: Emit) -> None:
        if cmd.type in INTERNAL_EVENTS:
            if cmd.type == "detected":
                self.on_detected(cmd.fields["server"])
            return
        wall = self.core.state.wall_offset
        fields = {
            k: (v + wall if k.endswith("_at") and isinstance(v, float) else v) for k, v in cmd.fields.items()
        }
        self.emit(cmd.type, fields)


def _log_planning_error(step: str, exc: Exception) -> None:
    if isinstance(exc, FailsoftError):
        log.warning("%s planning failed: %s", step, exc)
    else:  # a defect, not a verdict of the policy: keep the traceback
        log.error("%s planning failed", step, exc_info=exc)
