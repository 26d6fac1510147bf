"""What the orchestration core asks its driver to do: plain, frozen commands.

The core never performs I/O; every decision it makes comes out as a list of these, and the driver
(asyncio and Ray in the runtime, SimPy in the simulator) carries them out and feeds the outcome back
as the core's next input:

==================  ==========================================  ==========================================
command             the driver does                             and then calls
==================  ==========================================  ==========================================
:class:`Load`       load a variant on a server                  ``Orchestrator.load_done(load_id, ...)``
:class:`Unload`     unload it (loads to that server wait for it) nothing
:class:`Publish`    push the routing table to the gateways      nothing
:class:`Emit`       send an event to clients (websocket)         nothing
:class:`Planned`    record a failover plan (status, metrics)     nothing
:class:`PlanFailover`   run the failover policy                 ``Orchestrator.failover_planned(...)``
:class:`PlanProactive`  run the proactive (warm backup) policy  ``Orchestrator.proactive_planned(...)``
:class:`Inspect`    ask a server what it holds                  ``Orchestrator.inspected(server, ...)``
==================  ==========================================  ==========================================

An ``llm`` service's workers (member apps: :mod:`~failsoft.orchestration.llm`) have five more,
carried out by the service's worker executor (the runtime's ``LlmFleet``, the simulator's twin):

* :class:`StartLlmWorker`: start a worker on a server (a standby there adopts it when the core
  counted one), its draft first when it says so; then ``Orchestrator.llm_started(...)`` (phase
  ``draft`` or ``serving``) or ``llm_start_failed(...)``;
* :class:`SwitchLlmTarget`: let a drafting worker serve its target once loaded; then
  ``llm_started(..., "serving")`` or ``llm_start_failed``;
* :class:`StopLlmWorker` (end a process: gone, or replaced), :class:`StartLlmStandby` (a standby
  process), :class:`PublishLlm` (the service's worker table changed): nothing back.

Times inside commands are on the core's clock (see :mod:`failsoft.orchestration.state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failsoft.domain import FailoverAction, FailoverPlan, Scenario
from failsoft.orchestration.loads import Priority


@dataclass(frozen=True, slots=True)
class Load:
    load_id: int
    server: str
    app: str
    family: str
    variant: str
    priority: Priority

    @property
    def background(self) -> bool:
        """Warm backups and upgrades yield the CPU to everything else."""
        return self.priority >= Priority.WARM


@dataclass(frozen=True, slots=True)
class Unload:
    server: str
    app: str
    variant: str


@dataclass(frozen=True, slots=True)
class Publish:
    """The routing table changed; ``apps`` are the apps whose route changed."""

    apps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Emit:
    """An event for clients: ``failure``, ``failover``, ``upgrade``, ``restore``, ``unrecovered``,
    ``server_up``, ``ready``. ``fields`` holds app, server, variant, accuracy and the type's extras;
    fields named ``*_at`` are core times (the runtime's driver turns them into wall-clock time)."""

    type: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Planned:
    """A failover plan was applied (for status, metrics and the simulator's records); ``applied``
    are its actions the core carried out (an action whose app or servers changed meanwhile is not)."""

    plan: FailoverPlan
    at: float
    applied: tuple[FailoverAction, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanFailover:
    plan_id: int
    scenario: Scenario
    failed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlanProactive:
    plan_id: int
    scenario: Scenario


class InspectPurpose(StrEnum):
    RESTORE = "restore"  # a failed server speaks again: what did it keep?
    GC = "gc"  # periodic comparison of what servers hold with what they should
    VERIFY = "verify"  # a restarted controller checks what it read from the store


@dataclass(frozen=True, slots=True)
class Inspect:
    server: str
    purpose: InspectPurpose


@dataclass(frozen=True, slots=True)
class StartLlmWorker:
    """Start ``worker`` of ``service`` on ``server`` as process ``incarnation``: a standby on that
    server adopts it when there is one (``standby``: the core counted one there), else a new process.
    ``draft_first``: load the draft, report phase ``draft``, and wait for :class:`SwitchLlmTarget`."""

    service: str
    worker: str
    server: str
    incarnation: int
    draft_first: bool = False
    standby: bool = False


@dataclass(frozen=True, slots=True)
class SwitchLlmTarget:
    """LUMEN's progressive recovery, second half: the drafting ``worker`` serves its target once it
    is loaded (the executor reports phase ``serving``)."""

    service: str
    worker: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class StopLlmWorker:
    """End ``worker``'s process ``incarnation`` (gone already, or replaced): cancel its start."""

    service: str
    worker: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class StartLlmStandby:
    """Start a standby process of ``service`` on ``server`` (imports done, no target); ``draft``:
    it loads the service's draft too (progressive recovery: the core counted its memory there), so
    that a draft-first restart it adopts drafts at once."""

    service: str
    server: str
    draft: bool = False


@dataclass(frozen=True, slots=True)
class PublishLlm:
    """``service``'s worker table changed (a placement, a phase, an incarnation)."""

    service: str


LlmCommand = StartLlmWorker | SwitchLlmTarget | StopLlmWorker | StartLlmStandby | PublishLlm
Command = Load | Unload | Publish | Emit | Planned | PlanFailover | PlanProactive | Inspect | LlmCommand
