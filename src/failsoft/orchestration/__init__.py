"""The orchestration core, shared by the runtime and the simulator (sans-I/O).

* :mod:`~failsoft.orchestration.state`: the controller's picture of the cluster, and the snapshot
  of it that policies plan on;
* :mod:`~failsoft.orchestration.core`: :class:`Orchestrator`, every decision from a silent server to
  every app served again, as inputs in and :mod:`~failsoft.orchestration.commands` out;
* :mod:`~failsoft.orchestration.operations`, :mod:`~failsoft.orchestration.warm` and
  :mod:`~failsoft.orchestration.copies`: collaborators the orchestrator holds, each owning its state:
  the per-app operations (recover, upgrade, return home, repair), the warm-backup re-planning, and
  the copies a mechanism pins (a Jellyfish rung, a HAMS backup);
* :mod:`~failsoft.orchestration.llm` (records in :mod:`~failsoft.orchestration.llm_state`): an
  ``llm`` service's workers as member apps: placed with their memory counted, failed, restarted;
* :mod:`~failsoft.orchestration.effects`: what all three do to the cluster (loads, routes, timers,
  the commands out), the one layer they share;
* :mod:`~failsoft.orchestration.loads`: per-server load slots by priority;
* :mod:`~failsoft.orchestration.settings`: :class:`OrchestrationSettings`.

Nothing here imports Ray, SimPy, FastAPI or torch, reads a clock or touches the network: a test
checks the import boundary. The drivers are :mod:`failsoft.runtime.core_driver` (asyncio, Ray) and
:mod:`failsoft.sim.controller` (SimPy).
"""

from failsoft.orchestration.commands import (
    Command,
    Emit,
    Inspect,
    InspectPurpose,
    Load,
    PlanFailover,
    Planned,
    PlanProactive,
    Publish,
    Unload,
)
from failsoft.orchestration.copies import CopyRequest
from failsoft.orchestration.core import Orchestrator, Phase
from failsoft.orchestration.loads import LoadQueue, Priority
from failsoft.orchestration.settings import OrchestrationSettings
from failsoft.orchestration.state import AppRecord, ClusterState, RouteKind, ServerRecord, WarmRecord

__all__ = [
    "AppRecord",
    "ClusterState",
    "Command",
    "CopyRequest",
    "Emit",
    "Inspect",
    "InspectPurpose",
    "Load",
    "LoadQueue",
    "OrchestrationSettings",
    "Orchestrator",
    "Phase",
    "PlanFailover",
    "PlanProactive",
    "Planned",
    "Priority",
    "Publish",
    "RouteKind",
    "ServerRecord",
    "Unload",
    "WarmRecord",
]
