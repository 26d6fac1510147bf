"""The HTTP gateway: KServe v2 inference, events, metrics and token-protected admin, on FastAPI.

Endpoints:

* ``GET /v2/health/live``, ``GET /v2/health/ready`` (ready once the controller has deployed),
  ``GET /v2/models/{name}``, ``GET /v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``;
  ``name`` names a *service*: an app served alone is a service of the app's name;
* ``POST /v2/repository/index`` (Triton's repository extension): every service with its state;
* ``GET /v2/events`` (websocket, optional ``?app=NAME``): the controller's events as JSON;
* the endpoints a mode serves beside inference (:meth:`Dispatcher.http_routes`), such as the
  ``slo`` mode's ``POST /v2/clients``, ``POST /v2/clients/{id}/bandwidth`` and
  ``DELETE /v2/clients/{id}`` (:mod:`failsoft.runtime.gateway.slo_clients`);
* ``GET /metrics``: Prometheus text, the gateway's (:mod:`failsoft.runtime.gateway.metrics`) and
  every agent's, asked at each scrape (:mod:`failsoft.runtime.gateway.fleet`);
* ``/admin/...`` (:mod:`failsoft.runtime.gateway.admin`), on a separate ASGI app
  (:attr:`Gateway.admin_app`) that the session serves on its own port (the admin plane); they need
  ``Authorization: Bearer <token>``. The inference app answers 404 there.

A request is served by its service's dispatcher (:mod:`failsoft.runtime.gateway.dispatch`): the
gateway validates it, gives it a deadline and an id, and maps what the dispatcher raises to HTTP by
class (:func:`failsoft.errors.http_status`). The gateway knows no mode: it builds the dispatchers
through the factory and asks each, through the contract, for its front app, its endpoints and its
background work. The gateway is stateless: routes come from the controller by long-poll. A bad
request gets a 4xx with ``{"error": ...}`` naming the problem; a service with no route before the
deadline gets 503 with ``Retry-After``; nothing a client sends produces a 5xx or stops the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route
from starlette.types import Scope

from failsoft.clock import AsyncClock, MonotonicClock
from failsoft.domain import App, Family, Scenario
from failsoft.errors import (
    FailsoftError,
    InvalidRequestError,
    OverloadedError,
    ServerUnavailableError,
    UnknownNameError,
    http_status,
)
from failsoft.policies.detection import RouteHealth
from failsoft.runtime import logs
from failsoft.runtime.chaos import Chaos
from failsoft.runtime.cluster import AgentRef, ControllerRef
from failsoft.runtime.config import GatewaySettings
from failsoft.runtime.dataplane import LinkChange
from failsoft.runtime.gateway import admin
from failsoft.runtime.gateway.access import AccessMiddleware
from failsoft.runtime.gateway.dispatch import Answer, DispatchContext, Dispatcher, Move, build_dispatchers
from failsoft.runtime.gateway.dispatch import Request as Work
from failsoft.runtime.gateway.events import EventHub, Feed
from failsoft.runtime.gateway.fleet import FleetFigures
from failsoft.runtime.gateway.http_io import CLIENT_LEFT, read_body, retry_after
from failsoft.runtime.gateway.http_io import byte_count as _byte_count
from failsoft.runtime.gateway.http_io import unless_the_client_leaves as _unless_the_client_leaves
from failsoft.runtime.gateway.link import ControllerLink
from failsoft.runtime.gateway.metrics import GatewayMetrics
from failsoft.runtime.gateway.protocol import (
    ModelMeta,
    binary_infer_response,
    infer_response,
    model_metadata,
    parse_infer_request,
)
from failsoft.runtime.gateway.routes import RouteMirror
from failsoft.runtime.loop import spawn
from failsoft.services import Service, with_singles
from failsoft.versions import version_of

log = logging.getLogger(__name__)
STATS_POLL_S = 2.0
RETIRE_S = 5.0  # a removed service's dispatcher is closed this long after its last request came in


ONGOING_REPORT_S = 0.25  # how often autoscaled apps' requests in flight go to the controller


@dataclass(frozen=True, slots=True)
class Served:
    """A name the gateway serves: its service, dispatcher, and the member app whose model it takes."""

    service: Service
    dispatcher: Dispatcher
    lead: App | None  # None: a mode whose members are no apps (llm: its own endpoints)

    def app(self) -> App:
        """The app whose model an infer request takes; InvalidRequestError for an ``llm`` service."""
        if self.lead is None:
            raise InvalidRequestError(
                f"{self.service.name!r} is an {self.service.mode.value} service: send it generate or "
                f"generate_stream requests (/v2/models/{self.service.name}/generate_stream)"
            )
        return self.lead


class Gateway:
    """Holds the gateway's parts; :attr:`app` is the ASGI application of the data plane (it runs
    the background work), :attr:`admin_app` that of the admin plane, served beside it."""

    def __init__(
        self,
        settings: GatewaySettings,
        controller: ControllerRef,
        agents: dict[str, AgentRef],
        chaos: Chaos,
        apps: dict[str, App],
        models: dict[str, ModelMeta],
        variants: dict[str, list[str]],
        admin_token: str,
        services: Sequence[Service] | None = None,
        clock: AsyncClock | None = None,
        families: Mapping[str, Family] | None = None,
        llm: Sequence[Any] = (),
    ) -> None:
        """``llm``: the config's llm services (:class:`~failsoft.runtime.llm_config.LlmServing`)."""
        self.settings, self.controller, self.chaos = settings, controller, chaos
        self.apps, self.models, self.variants = apps, models, variants
        self.admin_token = admin_token
        self.clock = clock or MonotonicClock()
        self.link = ControllerLink()
        self.metrics = GatewayMetrics()
        self.fleet = FleetFigures()  # the agents' figures, served with the gateway's
        self.metrics.registry.register(self.fleet)
        self.mirror = RouteMirror(controller, self.clock, self.link)
        self._agents = agents
        services = (*with_singles(services or (), apps), *(s.service for s in llm))
        self.health = RouteHealth(settings.unhealthy_after)
        self._families: dict[str, Family] = dict(families or {})  # grows with a deploy
        self._reports: set[asyncio.Task[Any]] = set()
        context = DispatchContext(
            self.mirror,
            self._agent,
            self.clock,
            self._outcome,
            apps,
            self._families,
            input_shape=self._input_shape,
            event=self._publish,
            servers=self._servers,
            copies=controller,
            llm={s.name: s for s in llm},
            fleet=controller,
            moved=self._moved,
        )
        self._context = context
        self._closing: set[asyncio.Task[Any]] = set()
        self.deployer: Any = None  # failsoft deploy's side here (runtime/redeploy.py), set by the session
        dispatchers = build_dispatchers(services, context)
        self.served = {
            s.name: Served(s, dispatchers[s.name], _lead(dispatchers[s.name], apps)) for s in services
        }
        chaos.companions = self._companions
        self.fleet.add_source("worker", self._worker_figures)  # llm services' workers
        self.hub = EventHub(controller, self.metrics.on_event, self.clock, self.link)
        self.metrics.watch_apps(self._app_load)
        self.controller_stats: dict[str, Any] | None = None
        self.app = self._build()
        self.admin_app = self._build_admin()

    # background tasks ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        loops = [
            self.mirror.run(),
            self.hub.run(),
            self._poll_stats(),
            self._report_ongoing(),
            self._connect_agents(),
        ]
        tasks = [asyncio.create_task(c) for c in loops]
        try:
            for served in self.served.values():  # their background work (re-planning, backups)
                await served.dispatcher.start()
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            closing = [s.dispatcher.close() for s in self.served.values()]
            closing.append(self._context.losses.close())  # reports of lost models under way
            await asyncio.gather(*closing, return_exceptions=True)  # their background work
            for agent in self._agents.values():  # before the agents stop: no "connection lost"
                link = getattr(agent, "data_plane", None)
                if link is not None:
                    link.close()

    async def _connect_agents(self) -> None:
        """Every agent's data-plane connection, made at start rather than at its first request, so
        that the controller knows each one up (servers holding only warm backups included)."""
        for server in sorted(self._agents):
            agent = self._agent(server)
            if not getattr(agent, "uses_data_plane", False):  # FAILSOFT_DATA_PLANE=ray, or a test fake
                continue
            link = agent.data_plane
            try:
                await link.connect(5.0)
            except FailsoftError as exc:  # its first request tries again
                log.debug("no data-plane connection to %s yet: %s", server, exc)

    async def _poll_stats(self) -> None:
        while True:
            try:
                self.controller_stats = await self.controller.stats()
                self.link.ok("stats poll")
            except FailsoftError as exc:
                self.link.failed("stats poll", exc)
            await self.clock.sleep(STATS_POLL_S)

    # a deploy -------------------------------------------------------------------------------------
    async def apply_deployment(
        self,
        deployment: Scenario,
        models: Mapping[str, ModelMeta],
        variants: Mapping[str, list[str]],
        retire_s: float = RETIRE_S,
    ) -> dict[str, list[str]]:
        """A deploy was accepted: serve its new and changed services (each dispatcher started before
        it takes a request), stop taking requests for those it removed or changed (their dispatchers
        are closed ``retire_s`` later, once the requests on their way are answered)."""
        apps = {a.name: a for a in deployment.apps}
        self.models.update(models)
        self.variants.update(variants)
        self._families.update({f.name: f for f in deployment.families})
        self.apps.update(apps)  # the dispatch context reads the same dict
        wanted = {s.name: s for s in with_singles(deployment.services, apps)}
        gone = [n for n, sv in self.served.items() if wanted.get(n) != sv.service]
        new = [s for n, s in wanted.items() if n not in self.served or n in gone]
        dispatchers = build_dispatchers(new, self._context)
        for dispatcher in dispatchers.values():
            await dispatcher.start()
        retired = [self.served.pop(n) for n in gone]
        for service in new:
            d = dispatchers[service.name]
            front = d.front_app()
            self.served[service.name] = Served(service, d, None if front is None else self.apps[front])
        for name, served in self.served.items():  # settings changed in place (an SLO: the timeout)
            if served.lead is None:
                continue
            lead = apps.get(served.lead.name)
            if lead is not None and lead != served.lead:
                self.served[name] = dataclasses.replace(served, lead=lead)
        spawn(self._retire(retired, set(self.apps) - set(apps), retire_s), "gateway-retire", self._closing)
        return {"added": [s.name for s in new], "removed": [s.service.name for s in retired]}

    async def _retire(self, retired: list[Served], apps: set[str], after_s: float) -> None:
        await self.clock.sleep(after_s)
        await asyncio.gather(*(s.dispatcher.close() for s in retired), return_exceptions=True)
        serving = {m for s in self.served.values() for m in s.service.members}
        for app in apps - serving:  # unless a later deploy brought it back meanwhile
            self.apps.pop(app, None)

    # replicas: what autoscaling and /metrics read ----------------------------------------------------
    def _ongoing(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for served in self.served.values():
            counts.update(served.dispatcher.ongoing())
        return counts

    def _app_load(self) -> dict[str, tuple[int, int]]:
        return {app: (len(self.mirror.active(app)), n) for app, n in self._ongoing().items()}

    async def _report_ongoing(self) -> None:
        """Tell the controller the requests in flight of every autoscaled app, every
        :data:`ONGOING_REPORT_S` (Ray Serve's handles push the same metric to its controller)."""
        while True:
            await self.clock.sleep(ONGOING_REPORT_S)
            scaled = self.mirror.autoscaled
            if not scaled:
                continue
            counts = {app: n for app, n in self._ongoing().items() if app in scaled}
            try:
                await self.controller.report_ongoing(counts)
                self.link.ok("ongoing report")
            except FailsoftError as exc:
                self.link.failed("ongoing report", exc)

    # app-level health -------------------------------------------------------------------------------
    def _outcome(self, server: str, ok: bool, error: str) -> None:
        """A server's answer or failure; enough failures in a row and the controller fails it over."""
        if not self.health.record(server, ok, error):  # timeouts are overload: never a verdict
            return
        reason = f"{self.health.errors_to_fail} inference calls in a row failed, the last: {error}"
        log.warning("server %s heartbeats but does not serve (%s): asking for a failover", server, reason)
        spawn(self._report_unhealthy(server, reason), f"report-unhealthy-{server}", self._reports)

    async def _report_unhealthy(self, server: str, reason: str) -> None:
        try:
            await self.controller.report_unhealthy(server, reason)
        except FailsoftError as exc:  # the controller is away: the next run of errors asks again
            log.warning("could not report server %s as unhealthy: %s", server, exc)

    def _moved(self, move: Move) -> None:
        """A request answered after it left a dead server: its timeline, in wall-clock seconds."""
        wall = time.time() - self.clock.now()
        doc = dataclasses.asdict(move)
        for key in ("started_at", "lost_at", "failed_at", "route_seen_at", "sent_at", "answered_at"):
            if doc[key] is not None:  # route_at is the controller's wall clock already
                doc[key] += wall
        self.metrics.move_log.append(doc)

    # helpers -------------------------------------------------------------------------------------
    def _input_shape(self, app: str) -> tuple[int, ...] | None:
        meta = self.models.get(self.apps[app].family) if app in self.apps else None
        return None if meta is None else tuple(meta.input_shape)

    def _publish(self, event: dict[str, Any]) -> None:
        """A dispatcher's event (a coded service reconstructing a failed member), stamped and sent."""
        self.hub.publish({"timestamp": time.time(), "source": "gateway", **event})

    def _companions(self, server: str) -> list[int]:
        """The processes that run on ``server`` beside its agent (an llm service's workers): a
        server killed by chaos takes them with it."""
        pids: list[int] = []
        for served in self.served.values():
            pids.extend(served.dispatcher.processes_on(server))
        return pids

    def _worker_figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for served in self.served.values():
            figures.update(served.dispatcher.worker_figures())
        return figures

    def _servers(self) -> tuple[str, ...]:
        return tuple(sorted(self._agents))

    def _agent(self, server: str) -> AgentRef:
        agent = self._agents.get(server)
        if agent is None:  # being replaced (revived) right now
            raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
        link = getattr(agent, "data_plane", None)  # test fakes have none
        if link is not None and link.listener is None:
            link.listener = self._link_changed
        return agent

    def _link_changed(self, change: LinkChange) -> None:
        """A data-plane connection was made or ended (the agent died): the route mirror and the
        controller hear it (the mirror at once: calls then leave the server before any route comes)."""
        if change.up:
            self.mirror.connection_made(change.server)
        else:
            self.mirror.connection_lost(change.server)
            log.warning("server %s: data plane connection lost (%s)", change.server, change.reason)
            self._publish({"type": "connection_lost", "server": change.server, "reason": change.reason})
        spawn(self._report_link(change), f"report-link-{change.server}", self._reports)

    async def _report_link(self, change: LinkChange) -> None:
        try:
            await self.controller.report_link(change.server, change.incarnation, change.up, change.reason)
        except FailsoftError as exc:  # the controller is away: heartbeats still tell it
            log.warning("could not report server %s's connection: %s", change.server, exc)

    def _served(self, name: str) -> Served:
        served = self.served.get(name)
        if served is None:
            names = sorted(self.served)
            known = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            raise UnknownNameError(f"unknown app {name!r}: no service of that name (services: {known})")
        return served

    def _check_version(self, name: str, version: str) -> None:
        """UnknownNameError (404) unless ``version`` of ``name`` is the one its route serves."""
        served = self._served(name)
        route = self.mirror.route(served.app().name)
        loaded = None if route is None else version_of(route.variant)
        if not (version.isascii() and version.isdigit()) or int(version) != loaded:
            now = "none is loaded" if loaded is None else f"version {loaded} is loaded"
            raise UnknownNameError(f"model {name!r} has no loaded version {version!r} ({now})")

    def _timeout_s(self, app: App, asked: float | None) -> float:
        if asked is not None:
            return asked
        return max(app.slo_ms or 0.0, self.settings.min_timeout_ms) / 1000.0

    async def read_body(self, request: Request, limit: int) -> bytes:
        """The request's body, refused (413) past ``limit`` bytes, whatever Content-Length claims."""
        return await read_body(request, limit)

    async def infer(self, name: str, request: Request) -> Response:
        started = time.perf_counter()
        answer: Answer | None = None
        code, label = 200, "-"
        try:
            served = self._served(name)
            label = name
            header_length = _byte_count(
                request.headers.get("inference-header-content-length"), "Inference-Header-Content-Length"
            )
            body = await self.read_body(request, self.settings.max_body_bytes)
            lead = served.app()
            meta = self.models[lead.family]
            req = parse_infer_request(body, name, meta, self.settings.max_batch, header_length)
            deadline = self.clock.now() + self._timeout_s(lead, req.timeout_s)
            rid = logs.request_id.get() or uuid.uuid4().hex  # the access log's and X-Request-Id's
            work = Work(name, req.batch, deadline, rid, req.parameters)
            answer = await _unless_the_client_leaves(request, served.dispatcher.dispatch(work))
            if answer is None:
                code = CLIENT_LEFT
                return Response(status_code=CLIENT_LEFT)  # nobody reads it
            if req.binary_output:
                raw, header = binary_infer_response(name, answer.outputs, req, answer.parameters())
                return Response(
                    raw,
                    media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(header)},
                )
            return _json(infer_response(name, answer.outputs, req, answer.parameters()))
        except FailsoftError as exc:
            code = http_status(exc)
            raise
        except asyncio.CancelledError:  # the gateway stops
            code = CLIENT_LEFT
            raise
        except Exception:
            code = 500
            raise
        finally:
            self.metrics.observe(label, code, time.perf_counter() - started, answer if code == 200 else None)

    def repository_index(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "mode": s.service.mode.value, **s.dispatcher.describe()}
            for name, s in self.served.items()
        ]

    # the ASGI app --------------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        api = FastAPI(title="failsoft gateway", lifespan=self._lifespan, docs_url=None, redoc_url=None)
        api.add_middleware(AccessMiddleware)
        _install_error_handlers(api)
        self._inference_routes(api)
        self._observability_routes(api)
        self._mode_routes(api)
        return api

    def _build_admin(self) -> FastAPI:
        api = FastAPI(title="failsoft admin", docs_url=None, redoc_url=None, openapi_url=None)
        api.add_middleware(AccessMiddleware)
        _install_error_handlers(api)
        admin.install(api, self)
        return api

    def _mode_routes(self, api: FastAPI) -> None:
        """Each mode's own endpoints (:meth:`Dispatcher.http_routes`), once per mode."""
        modes: dict[type[Dispatcher], dict[str, Dispatcher]] = {}
        for name, served in self.served.items():
            modes.setdefault(type(served.dispatcher), {})[name] = served.dispatcher
        for cls, dispatchers in modes.items():
            router = cls.http_routes(dispatchers)
            if router is not None:
                api.include_router(router)

    def _inference_routes(self, api: FastAPI) -> None:
        @api.get("/v2")
        async def server_metadata() -> dict[str, Any]:
            return {
                "name": "failsoft",
                "version": "0.1.0",
                "extensions": ["model_repository", "binary_tensor_data", "classification", "failsoft_events"],
            }

        @api.get("/v2/health/live")
        async def live() -> dict[str, Any]:
            return {"live": True}

        @api.get("/v2/health/ready")
        async def ready() -> Response:
            ok = self.mirror.ready
            return JSONResponse(
                {"ready": ok} if ok else {"ready": False, "error": "not deployed yet"}, 200 if ok else 503
            )

        @api.get("/v2/models/{name}")
        async def metadata(name: str) -> dict[str, Any]:
            lead = self._served(name).app()
            return model_metadata(name, lead.family, self.models[lead.family], self.variants[lead.family])

        @api.get("/v2/models/{name}/ready")
        async def model_ready(name: str) -> Response:
            ok = self._served(name).dispatcher.ready()
            return JSONResponse({"name": name, "ready": ok}, 200 if ok else 503)

        # The infer endpoints are plain Starlette routes: FastAPI's per-request work (solving the
        # handler's parameters, validating the path's name with pydantic, two exit stacks) was a
        # measurable share of the gateway's own time on a small model, for nothing the handler uses.
        async def infer(request: Request) -> Response:
            return await self.infer(request.path_params["name"], request)

        api.router.routes.append(_PlainRoute("/v2/models/{name}/infer", infer, methods=["POST"]))

        # a loaded version of a model (Triton's versions in the URL); only the version served answers
        @api.get("/v2/models/{name}/versions/{version}")
        async def version_metadata(name: str, version: str) -> dict[str, Any]:
            self._check_version(name, version)
            return await metadata(name)

        @api.get("/v2/models/{name}/versions/{version}/ready")
        async def version_ready(name: str, version: str) -> Response:
            self._check_version(name, version)
            return await model_ready(name)

        async def version_infer(request: Request) -> Response:
            name = request.path_params["name"]
            self._check_version(name, request.path_params["version"])
            return await self.infer(name, request)

        api.router.routes.append(
            _PlainRoute("/v2/models/{name}/versions/{version}/infer", version_infer, methods=["POST"])
        )

        @api.post("/v2/repository/index")
        async def repository_index() -> list[dict[str, Any]]:
            return self.repository_index()

    def _observability_routes(self, api: FastAPI) -> None:
        @api.websocket("/v2/events")
        async def events(ws: WebSocket) -> None:
            await self._stream_events(ws)

        @api.get("/metrics")
        async def metrics() -> Response:
            await self.fleet.refresh(self._agents)
            body = self.metrics.render(self.mirror.version, self.link.connected, self.controller_stats)
            return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _stream_events(self, ws: WebSocket) -> None:
        """Send events until the client leaves (watched, so a quiet stream notices at once), the
        subscriber falls behind, or the gateway stops."""
        feed = self.hub.subscribe()
        if feed is None:
            await _refuse(ws, f"too many event subscribers (limit {self.hub.max_subscribers}); retry later")
            return
        try:
            await ws.accept()
            async with anyio.create_task_group() as tasks:  # the first to end ends the other

                async def watch() -> None:
                    await _until_closed(ws)
                    tasks.cancel_scope.cancel()

                tasks.start_soon(watch)
                await _send_events(ws, feed, ws.query_params.get("app"))
                tasks.cancel_scope.cancel()
        finally:
            self.hub.unsubscribe(feed)


class _PlainRoute(Route):
    """A Starlette route that names itself in the request's scope, as FastAPI's routes do (the
    access middleware names a request's span after the route's path template)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


def _lead(dispatcher: Dispatcher, apps: Mapping[str, App]) -> App | None:
    front = dispatcher.front_app()
    return None if front is None else apps[front]


async def _send_events(ws: WebSocket, feed: Feed, only: str | None) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        while (event := await feed.get()) is not None:
            if only is None or event.get("app") in (None, only):
                await ws.send_json(event)
        await ws.close(code=1013, reason="this subscriber did not keep up with the events")


async def _until_closed(ws: WebSocket) -> None:
    """Return when the client closes the websocket (it sends nothing else that matters)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass


async def _refuse(ws: WebSocket, message: str) -> None:
    """Refuse a websocket before its handshake: HTTP 503 with a JSON error where the server can."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse({"error": message}, 503, headers={"Retry-After": "1"}))
    else:
        await ws.close(code=1013, reason=message)


def _json(content: Any) -> Response:
    """JSON that may hold NaN or Infinity (a model's outputs can), written as Python's json writes them."""
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json")


def _error_response(exc: FailsoftError) -> JSONResponse:
    status = http_status(exc)
    headers = retry_after(exc)
    if isinstance(exc, OverloadedError):  # shedding, not a fault: counted by code in failsoft_requests_total
        log.debug("request refused: %s", exc)
    elif status >= 500:
        log.warning("request failed: %s", exc)
    return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)


def _install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(FailsoftError)
    async def failsoft_error(_: Request, exc: FailsoftError) -> JSONResponse:
        return _error_response(exc)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"{where}: {first.get('msg')}"}, status_code=422)

    @api.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in the gateway")
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)
