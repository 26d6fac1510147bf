"""The dispatch seam: how the gateway turns one request to a service into one answer.

A *service* (:mod:`failsoft.services`) groups member apps under a *mode*; each mode has one
dispatcher class (:mod:`failsoft.runtime.gateway.dispatch`), which serves a request over the
service's members. The contract, and who calls what, when:

* **At start-up** the gateway builds one dispatcher per service: ``cls(service, context)``. The
  :class:`DispatchContext` is all a dispatcher may touch: the mirror of the routing table (each
  member app's current route, and waits for changes), the agents by server, and the clock.
* **Per request** the gateway calls :meth:`Dispatcher.dispatch` once, on its event loop, many
  requests at a time. The request carries its batch (validated already), its deadline on the
  context's clock, and an id unique in this gateway. The coroutine returns an :class:`Answer`, or
  raises a :class:`~failsoft.errors.FailsoftError`, which the gateway maps to HTTP by class
  (:func:`~failsoft.errors.http_status`): no route before the deadline
  (:class:`~failsoft.errors.NoRouteError`, 503), a route but no answer in time
  (:class:`~failsoft.errors.DeadlineExceededError`, 504), a queue that refused the work
  (:class:`~failsoft.errors.OverloadedError`, 503 with ``Retry-After``).
* **Cancellation.** The gateway cancels the coroutine when its client leaves or the gateway stops.
  What the dispatcher sent is then withdrawn (:meth:`AgentRef.cancel_nowait` with the id it used,
  by the call primitive), as when a request times out or moves to a newer route: no server keeps
  working for nobody.
* :meth:`Dispatcher.ready` and :meth:`Dispatcher.describe` answer ``/v2/models/{name}/ready`` and
  ``/v2/repository/index``; they are cheap reads of the mirror, called at any time.
* **What the gateway asks of a mode besides requests**, so that it never imports a mode's class:
  :meth:`Dispatcher.front_app` (the member whose model a request takes: its input is validated
  against it, ``/v2/models/{name}`` describes it), :meth:`Dispatcher.http_routes` (endpoints the
  mode serves beside inference, shared by its services: the ``slo`` mode's ``/v2/clients``,
  included once at start-up), :meth:`Dispatcher.start` (background work, once the gateway's event
  loop runs: the ``slo`` mode's re-planning loop, the ``graph`` mode's backup placement) and
  :meth:`Dispatcher.close` (that work stopped, when the gateway stops).
* **Every call to an agent** goes through one primitive,
  :func:`~failsoft.runtime.gateway.dispatch.calls.call_on_route`: it owns the time left, the race
  against a route change, withdrawal and the health rule, and returns what happened; the dispatcher
  decides what follows (retry on a newer route, drop lazily, decode from parity, promote a backup).

A dispatcher is *mechanism*: deadlines, retries, backoff, cancellation, fan-out and
reconstruction. Decisions that a paper makes (which worker a client is mapped to, which variant a
coded group runs, when to drop) are policies, taken from :mod:`failsoft.policies` by name and
called as pure functions; a dispatcher never hard-codes one.

An :class:`Answer` says who served the request and how; the infer response's ``parameters`` carry
its fields (:meth:`Answer.parameters`).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from failsoft.clock import AsyncClock
from failsoft.domain import App, Family
from failsoft.errors import CapacityError, FailsoftError
from failsoft.orchestration.copies import CopyRequest
from failsoft.services import Service, ServiceMode

if TYPE_CHECKING:
    from fastapi import APIRouter

    from failsoft.runtime.cluster import AgentRef
    from failsoft.runtime.gateway.routes import RouteMirror

log = logging.getLogger(__name__)


def _ignore(server: str, ok: bool, error: str) -> None:
    return None


def _no_shape(app: str) -> tuple[int, ...] | None:
    return None


def _no_event(event: dict[str, Any]) -> None:
    return None


def _no_servers() -> tuple[str, ...]:
    return ()


def _no_move(move: Move) -> None:
    return None


class CopyControl(Protocol):
    """How a dispatcher asks the orchestration core for a copy of its own (a Jellyfish rung, a HAMS
    backup) and gives it up: the controller's ``pin``/``unpin`` (``ControllerRef``). The core loads,
    counts and publishes the copy; the dispatcher learns it is ready from the routing table
    (:meth:`~failsoft.runtime.gateway.routes.RouteMirror.wait_pinned`). A dispatcher never loads,
    unloads or promotes a model itself: when a copy it relies on is gone from a server that lives
    (a call answered :class:`~failsoft.errors.ModelNotLoadedError`), it says so
    (``report_model_lost``) and the core decides (``Orchestrator.model_lost``: HAMS's backup is
    promoted as for a crash), which the dispatcher learns from the routing table."""

    async def pin(self, request: CopyRequest) -> str: ...

    async def unpin(self, app: str, server: str, owner: str) -> None: ...

    async def report_model_lost(self, app: str, server: str, variant: str) -> None: ...


class FleetControl(Protocol):
    """How the ``llm`` dispatcher follows the workers the orchestration core keeps alive (through
    the controller's :class:`~failsoft.runtime.llm_fleet.LlmFleet`): the worker table by long-poll,
    and a worker it saw die under a request, reported so that its restart begins at once
    (``ControllerRef``)."""

    async def wait_llm(self, service: str, epoch: str, version: int, timeout_s: float) -> dict[str, Any]: ...

    async def llm_failed(self, service: str, worker: str, incarnation: int, reason: str) -> bool: ...


class NoFleet:
    """No controller (a dispatcher built without one): no worker table ever comes."""

    async def wait_llm(self, service: str, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        import asyncio

        await asyncio.sleep(timeout_s)
        return {"epoch": epoch, "version": version, "value": None}

    async def llm_failed(self, service: str, worker: str, incarnation: int, reason: str) -> bool:
        return False


class NoCopies:
    """No controller to ask (a dispatcher built without one): every pin is refused."""

    async def pin(self, request: CopyRequest) -> str:
        raise CapacityError(f"no controller to pin a copy of {request.app!r} with")

    async def unpin(self, app: str, server: str, owner: str) -> None:
        return None

    async def report_model_lost(self, app: str, server: str, variant: str) -> None:
        return None


class LossReports:
    """Copies found gone from a live server, told to the orchestration core: a call answered
    :class:`~failsoft.errors.ModelNotLoadedError` (the call primitive reports it, for every
    dispatcher), and nothing else would move the route, since the server heartbeats on.

    One report per finding: while a report of a copy is under way, the other requests that find
    the same copy gone add none (the core would ignore them: its repair or promotion has begun).
    A report is sent in the background (the request does not wait for the controller's answer; it
    waits for the route the core publishes) and one that fails is logged: the core's periodic
    inspection of the server finds the loss too, later."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, str], asyncio.Task[None]] = {}

    def report(self, copies: CopyControl, app: str, server: str, variant: str) -> None:
        """Tell the core that ``server`` no longer holds ``app``'s ``variant`` (once per finding)."""
        key = (app, server, variant)
        if key in self._open:
            return
        task = asyncio.ensure_future(self._send(copies, key))
        self._open[key] = task
        task.add_done_callback(lambda _: self._open.pop(key, None))

    @staticmethod
    async def _send(copies: CopyControl, key: tuple[str, str, str]) -> None:
        app, server, variant = key
        try:
            await copies.report_model_lost(app, server, variant)
        except FailsoftError as exc:
            log.warning("could not report %s/%s lost on %s: %s", app, variant, server, exc)

    @property
    def under_way(self) -> int:
        """Reports sent and not answered yet."""
        return len(self._open)

    async def close(self) -> None:
        """Stop the reports under way (the gateway stops)."""
        tasks = list(self._open.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class DispatchContext:
    """What a dispatcher may use. ``agents(server)`` raises ServerUnavailableError when the server
    has no agent at the moment (it is being replaced). ``outcome(server, ok, error)`` is told how
    each call a server took on ended: answered, or failed by the server's own fault (an error while
    serving, or no answer by the deadline); app-level health is judged from it. Refusals by a full
    queue, bad input and calls that moved to a newer route are not outcomes. ``apps`` and
    ``families`` are the deployment's (a dispatcher that chooses variants reads their profiles);
    ``input_shape(app)`` is the shape of one query to a member app (without the batch dimension; None
    when unknown), ``event(dict)`` publishes a gateway event to the event stream (``/v2/events``), and
    ``servers()`` names the servers that have an agent, and ``copies`` asks the orchestration core
    for a copy of the dispatcher's own (:class:`CopyControl`). ``llm`` holds the ``llm`` services'
    settings by name (:class:`~failsoft.runtime.llm_config.LlmServing`) and ``fleet`` their worker
    tables (:class:`FleetControl`). ``moved(Move)`` hears of each request answered after it left a
    dead server (what ``/admin/recoveries`` lists under ``moves``). ``losses`` tells the core of the
    copies calls found gone from a live server, through ``copies`` (:class:`LossReports`)."""

    routes: RouteMirror
    agents: Callable[[str], AgentRef]
    clock: AsyncClock
    outcome: Callable[[str, bool, str], None] = _ignore
    apps: Mapping[str, App] = field(default_factory=dict)
    families: Mapping[str, Family] = field(default_factory=dict)
    input_shape: Callable[[str], tuple[int, ...] | None] = _no_shape
    event: Callable[[dict[str, Any]], None] = _no_event
    servers: Callable[[], tuple[str, ...]] = _no_servers
    copies: CopyControl = field(default_factory=NoCopies)
    llm: Mapping[str, Any] = field(default_factory=dict)
    fleet: FleetControl = field(default_factory=NoFleet)
    moved: Callable[[Move], None] = _no_move
    losses: LossReports = field(default_factory=LossReports)


@dataclass(frozen=True, slots=True)
class Move:
    """A request that met a dead server and was answered on its next route: the failure path's
    timeline as the gateway lived it (``bench failover`` reports it per request).

    ``left``: the server it left (its call failed there, or it was never sent there because its
    connection had ended already: ``failed_at`` None); ``to`` answered it, ``via`` says how that
    route was found: ``backup`` (a warm backup the gateway chose before the controller's route
    came), ``replica`` (another active route of the app), ``route`` (the controller's new route).
    Times are on the context's clock except ``route_at`` (wall clock, the controller's publication
    of the route taken, when ``via`` is ``route``): ``started_at`` when the request came to the
    dispatcher, ``lost_at`` when the gateway saw ``left``'s
    connection end (None: it did not, or not before the call failed), ``failed_at`` when the call on
    ``left`` ended, ``route_seen_at`` when the table that brought the route taken came in
    (``via`` ``route``), ``sent_at`` when the answering call was sent, ``answered_at`` its answer."""

    app: str
    request_id: str
    left: str
    to: str
    via: str
    started_at: float
    lost_at: float | None
    failed_at: float | None
    route_seen_at: float | None
    route_at: float | None
    sent_at: float
    answered_at: float


@dataclass(frozen=True, slots=True)
class Request:
    """One infer request to a service: a validated batch, a deadline on the context's clock, and an
    id unique in this gateway (a dispatcher derives one id per call it makes from it);
    ``parameters`` are the request's own (``parameters`` of the infer body), for the modes that read
    some (the ``slo`` mode: the client id and its bandwidth report)."""

    service: str
    batch: Any
    deadline: float
    request_id: str
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answer:
    """Who served a request, and how.

    ``server`` and ``variant`` answered it; ``degraded``: a smaller variant than the primary's stood
    in; ``reconstructed``: the output was decoded (ParM) rather than computed by the model asked;
    ``dropped``: the request was dropped to keep others within their SLO (``outputs`` is then
    None); ``accuracy`` is the answering variant's; ``kind`` the route's (primary, warm,
    progressive, cold); ``attempts`` the calls made (more than one when a failover happened under
    the request). ``detected_at`` and ``route_at`` (wall clock) are set when the route that answered
    is a failover's: when its failure was detected and when the route was published.
    """

    outputs: Any
    server: str
    variant: str
    degraded: bool
    accuracy: float
    kind: str
    attempts: int
    reconstructed: bool = False
    dropped: bool = False
    detected_at: float | None = None
    route_at: float | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # a mode's own answer parameters (slo: residence_ms, ...)

    def parameters(self) -> dict[str, Any]:
        """The infer response's ``parameters``."""
        return {
            "variant": self.variant,
            "server": self.server,
            "degraded": self.degraded,
            "reconstructed": self.reconstructed,
            "dropped": self.dropped,
            "accuracy": self.accuracy,
            "kind": self.kind,
            "attempts": self.attempts,
            **dict(self.extra),
        }


class Dispatcher(ABC):
    """Serves the requests of one service; one subclass per :class:`~failsoft.services.ServiceMode`."""

    mode: ClassVar[ServiceMode]

    def __init__(self, service: Service, context: DispatchContext) -> None:
        if service.mode is not self.mode:
            raise ValueError(f"{type(self).__name__} serves {self.mode.value} services, not {service.mode}")
        self.service = service
        self.context = context

    @abstractmethod
    async def dispatch(self, request: Request) -> Answer:
        """Answer ``request`` before its deadline, or raise the FailsoftError that says why not."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether a request sent now could be served (``/v2/models/{name}/ready``)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The service's entry in ``/v2/repository/index`` beside its name: ``state`` (READY or
        UNAVAILABLE), ``reason``, and what the mode can say about where it is served."""

    def front_app(self) -> str | None:
        """The member app whose model a request to this service takes: the gateway validates a
        request's input against it and describes it at ``/v2/models/{name}``. The first member by
        default; None for a mode whose members are no apps of the repository (``llm``: its
        endpoints are its own, :meth:`http_routes`)."""
        return self.service.members[0]

    @classmethod
    def http_routes(cls, dispatchers: Mapping[str, Dispatcher]) -> APIRouter | None:
        """The HTTP endpoints this mode serves beside the inference API, shared by its services
        (``dispatchers``: this mode's, by service name); the gateway includes them once, when it
        builds its app, and maps their errors as it maps any. None (the default): no endpoints."""
        return None

    def ongoing(self) -> Mapping[str, int]:
        """Requests in flight per member app (queued or running, as Ray Serve counts them): what the
        controller's autoscaling and ``failsoft_app_ongoing_requests`` read. Empty by default (a mode
        whose members do not scale)."""
        return {}

    def processes_on(self, server: str) -> list[int]:
        """Processes of this service that run on ``server`` beside its agent (an ``llm`` service's
        workers), which chaos kills with the server. None by default."""
        return []

    def worker_figures(self) -> Mapping[str, Callable[[], Awaitable[bytes]]]:
        """The service's own workers' Prometheus figures, by worker name (an ``llm`` service's:
        ``LlmWorkerRef.metrics``), which ``/metrics`` serves labelled ``worker``. None by default
        (a mode served by the agents, whose figures the gateway asks itself)."""
        return {}

    async def start(self) -> None:
        """Start the mode's background work (a re-planning loop, backup placement) as tasks the
        dispatcher owns: called once, on the gateway's event loop, before it serves. It must not
        wait on that work. Nothing by default."""
        return None

    async def close(self) -> None:
        """Stop the background work the dispatcher started (loops, timers, transfers) when the
        gateway stops; requests in flight are the server's to finish or cancel. Nothing by default."""
        return None
