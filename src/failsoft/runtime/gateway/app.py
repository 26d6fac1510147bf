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
* ``GET /metrics``: Prometheus text (:mod:`failsoft.runtime.gateway.metrics`);
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
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from failsoft.clock import AsyncClock, MonotonicClock
from failsoft.domain import App, Family
from failsoft.errors import (
    FailsoftError,
    InvalidRequestError,
    OverloadedError,
    ServerUnavailableError,
    UnknownNameError,
    http_status,
)
from failsoft.policies.detection import RouteHealth
from failsoft.runtime.chaos import Chaos
from failsoft.runtime.cluster import AgentRef, ControllerRef
from failsoft.runtime.config import GatewaySettings
from failsoft.runtime.dataplane import LinkChange
from failsoft.runtime.gateway import admin
from failsoft.runtime.gateway.dispatch import Answer, DispatchContext, Dispatcher, build_dispatchers
from failsoft.runtime.gateway.dispatch import Request as Work
from failsoft.runtime.gateway.events import EventHub, Feed
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
from failsoft.services import Service, with_singles

log = logging.getLogger(__name__)
STATS_POLL_S = 2.0
CLIENT_LEFT = 499  # nginx's code for a request whose client closed the connection first


@dataclass(frozen=True, slots=True)
class Served:
    """A name the gateway serves: its service, dispatcher, and the member app whose model it takes."""

    service: Service
    dispatcher: Dispatcher
    lead: App


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
    ) -> None:
        self.settings, self.controller, self.chaos = settings, controller, chaos
        self.apps, self.models, self.variants = apps, models, variants
        self.admin_token = admin_token
        self.clock = clock or MonotonicClock()
        self.link = ControllerLink()
        self.metrics = GatewayMetrics()
        self.mirror = RouteMirror(controller, self.clock, self.link)
        self._agents = agents
        services = with_singles(services or (), apps)
        self.health = RouteHealth(settings.unhealthy_after)
        self._reports: set[asyncio.Task[Any]] = set()
        context = DispatchContext(
            self.mirror,
            self._agent,
            self.clock,
            self._outcome,
            apps,
            dict(families or {}),
            input_shape=self._input_shape,
            event=self._publish,
            servers=self._servers,
            copies=controller,
        )
        dispatchers = build_dispatchers(services, context)
        self.served = {
            s.name: Served(s, dispatchers[s.name], apps[dispatchers[s.name].front_app()]) for s in services
        }
        self.hub = EventHub(controller, self.metrics.on_event, self.clock, self.link)
        self.controller_stats: dict[str, Any] | None = None
        self.app = self._build()
        self.admin_app = self._build_admin()

    # background tasks ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        loops = [self.mirror.run(), self.hub.run(), self._poll_stats(), self._connect_agents()]
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

    # app-level health -------------------------------------------------------------------------------
    def _outcome(self, server: str, ok: bool, error: str) -> None:
        """A server's answer or failure; enough failures in a row and the controller fails it over."""
        if not self.health.record(server, ok, error):  # timeouts are overload: never a verdict
            return
        reason = f"{self.health.errors_to_fail} inference calls in a row failed, the last: {error}"
        log.warning("server %s heartbeats but does not serve (%s): asking for a failover", server, reason)
        task = asyncio.ensure_future(self._report_unhealthy(server, reason))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _report_unhealthy(self, server: str, reason: str) -> None:
        try:
            await self.controller.report_unhealthy(server, reason)
        except FailsoftError as exc:  # the controller is away: the next run of errors asks again
            log.warning("could not report server %s as unhealthy: %s", server, exc)

    # helpers -------------------------------------------------------------------------------------
    def _input_shape(self, app: str) -> tuple[int, ...] | None:
        meta = self.models.get(self.apps[app].family) if app in self.apps else None
        return None if meta is None else tuple(meta.input_shape)

    def _publish(self, event: dict[str, Any]) -> None:
        """A dispatcher's event (a coded service reconstructing a failed member), stamped and sent."""
        self.hub.publish({"timestamp": time.time(), "source": "gateway", **event})

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
        """A data-plane connection was made or ended (the agent died): the controller hears it."""
        if not change.up:
            log.warning("server %s: data plane connection lost (%s)", change.server, change.reason)
            self._publish({"type": "connection_lost", "server": change.server, "reason": change.reason})
        task = asyncio.ensure_future(self._report_link(change))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

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

    def _timeout_s(self, app: App, asked: float | None) -> float:
        if asked is not None:
            return asked
        return max(app.slo_ms or 0.0, self.settings.min_timeout_ms) / 1000.0

    async def read_body(self, request: Request, limit: int) -> bytes:
        """The request's body, refused (413) past ``limit`` bytes, whatever Content-Length claims."""
        declared = _byte_count(request.headers.get("content-length"), "Content-Length")
        if declared is not None and declared > limit:
            raise InvalidRequestError(f"request body of {declared} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InvalidRequestError(f"request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
        return b"".join(chunks)

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
            meta = self.models[served.lead.family]
            req = parse_infer_request(body, name, meta, self.settings.max_batch, header_length)
            deadline = self.clock.now() + self._timeout_s(served.lead, req.timeout_s)
            work = Work(name, req.batch, deadline, uuid.uuid4().hex, req.parameters)
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
        _install_error_handlers(api)
        self._inference_routes(api)
        self._observability_routes(api)
        self._mode_routes(api)
        return api

    def _build_admin(self) -> FastAPI:
        api = FastAPI(title="failsoft admin", docs_url=None, redoc_url=None, openapi_url=None)
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
            lead = self._served(name).lead
            return model_metadata(name, lead.family, self.models[lead.family], self.variants[lead.family])

        @api.get("/v2/models/{name}/ready")
        async def model_ready(name: str) -> Response:
            ok = self._served(name).dispatcher.ready()
            return JSONResponse({"name": name, "ready": ok}, 200 if ok else 503)

        @api.post("/v2/models/{name}/infer")
        async def infer(name: str, request: Request) -> Response:
            return await self.infer(name, request)

        @api.post("/v2/repository/index")
        async def repository_index() -> list[dict[str, Any]]:
            return self.repository_index()

    def _observability_routes(self, api: FastAPI) -> None:
        @api.websocket("/v2/events")
        async def events(ws: WebSocket) -> None:
            await self._stream_events(ws)

        @api.get("/metrics")
        async def metrics() -> Response:
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


async def _unless_the_client_leaves(request: Request, dispatched: Awaitable[Answer]) -> Answer | None:
    """The answer, or None when the client disconnected first: the dispatch is then cancelled, which
    withdraws its calls from the servers' queues (nobody would read the answer)."""
    answer, error = None, None
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            # the body is read: the next message is the disconnect (or comes after the response)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        try:
            answer = await dispatched
        except Exception as exc:  # raised past the group, not wrapped in an ExceptionGroup
            error = exc
        tasks.cancel_scope.cancel()
    if error is not None:
        raise error
    return answer


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


def _byte_count(value: str | None, header: str) -> int | None:
    """A header that counts bytes: ASCII digits only (``"²".isdigit()`` is true, ``int("²")`` fails)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise InvalidRequestError(f"{header} must be a number of bytes, got {value[:40]!r}")
    return int(value)


def _json(content: Any) -> Response:
    """JSON that may hold NaN or Infinity (a model's outputs can), written as Python's json writes them."""
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json")


def _error_response(exc: FailsoftError) -> JSONResponse:
    status = http_status(exc)
    headers = None
    if isinstance(exc, OverloadedError):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    elif status == 503:
        headers = {"Retry-After": "1"}
    if status >= 500:
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
