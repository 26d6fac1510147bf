"""The HTTP gateway: KServe v2 inference, events, metrics and token-protected admin, on FastAPI.

Endpoints (DESIGN "HTTP"):

* ``GET /v2/health/live``, ``GET /v2/health/ready`` (ready once the controller has deployed),
  ``GET /v2/models/{app}``, ``GET /v2/models/{app}/ready``, ``POST /v2/models/{app}/infer``;
* ``POST /v2/repository/index`` (Triton's repository extension): every app with its state;
* ``GET /v2/events`` (websocket, optional ``?app=NAME``): the controller's events as JSON;
* ``GET /metrics``: Prometheus text (:mod:`failsoft.runtime.gateway.metrics`);
* ``/admin/status``, ``/admin/recoveries``, ``/admin/chaos/{kill,hang,resume,slow}``: need
  ``Authorization: Bearer <token>``.

The gateway is stateless: routes come from the controller by long-poll. A bad request gets a 4xx
with ``{"error": ...}`` naming the problem; an app with no route before the deadline gets 503 with
``Retry-After``; nothing a client sends produces a 5xx or stops the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from failsoft.domain import App
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    FailsoftError,
    InvalidRequestError,
    NoRouteError,
    ServerUnavailableError,
)
from failsoft.runtime.chaos import Chaos
from failsoft.runtime.cluster import AgentRef, ControllerRef
from failsoft.runtime.config import GatewaySettings
from failsoft.runtime.gateway.events import EventHub
from failsoft.runtime.gateway.metrics import GatewayMetrics
from failsoft.runtime.gateway.protocol import ModelMeta, infer_response, model_metadata, parse_infer_request
from failsoft.runtime.gateway.router import Answer, RouteMirror, Router

log = logging.getLogger(__name__)
STATS_POLL_S = 2.0


class KillBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str | None = None
    site: str | None = None


class ServerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str


class SlowBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str
    ms: float = Field(ge=0, le=600_000)
    load_ms: float | None = Field(default=None, ge=0, le=600_000)


class Gateway:
    """Holds the gateway's parts; :attr:`app` is the ASGI application to serve."""

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
    ) -> None:
        self.settings, self.controller, self.chaos = settings, controller, chaos
        self.apps, self.models, self.variants = apps, models, variants
        self.admin_token = admin_token
        self.metrics = GatewayMetrics()
        self.mirror = RouteMirror(controller)
        self.router = Router(self.mirror, self._agent)
        self._agents = agents
        self.hub = EventHub(controller, self.metrics.on_event)
        self.controller_stats: dict[str, Any] | None = None
        self.app = self._build()

    # background tasks ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(c) for c in (self.mirror.run(), self.hub.run(), self._poll_stats())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll_stats(self) -> None:
        while True:
            with contextlib.suppress(FailsoftError):
                self.controller_stats = await self.controller.stats()
            await asyncio.sleep(STATS_POLL_S)

    # helpers -------------------------------------------------------------------------------------
    def _agent(self, server: str) -> AgentRef:
        agent = self._agents.get(server)
        if agent is None:  # being replaced (revived) right now
            raise ServerUnavailableError(f"server {server!r} has no agent at the moment")
        return agent

    def _app(self, name: str) -> App:
        app = self.apps.get(name)
        if app is None:
            raise InvalidRequestError(f"unknown app {name!r} (apps: {', '.join(sorted(self.apps))})", 404)
        return app

    def _timeout_s(self, app: App, asked: float | None) -> float:
        if asked is not None:
            return asked
        return max(app.slo_ms or 0.0, self.settings.min_timeout_ms) / 1000.0

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise InvalidRequestError(f"request body of {declared} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InvalidRequestError(f"request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    def _check_admin(self, request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
            raise InvalidRequestError("admin endpoints need 'Authorization: Bearer <token>'", 401)

    async def infer(self, name: str, request: Request) -> Response:
        started = time.perf_counter()
        answer: Answer | None = None
        code = 200
        try:
            app = self._app(name)
            req = parse_infer_request(
                await self._body(request),
                name,
                self.models[app.family],
                self.settings.max_batch,
                _header_length(request),
            )
            answer = await self.router.infer(name, req.batch, self._timeout_s(app, req.timeout_s))
            route = answer.route
            parameters = {
                "variant": route.variant,
                "server": route.server,
                "degraded": route.degraded,
                "reconstructed": False,
                "accuracy": route.accuracy,
                "kind": route.kind,
                "attempts": answer.attempts,
            }
            return JSONResponse(infer_response(name, answer.outputs, req.request_id, parameters))
        except FailsoftError as exc:
            code = _status_of(exc)
            raise
        finally:
            self.metrics.observe(
                name if name in self.apps else "-", code, time.perf_counter() - started, answer
            )

    def repository_index(self) -> list[dict[str, Any]]:
        out = []
        for name in self.apps:
            route = self.mirror.route(name)
            out.append(
                {
                    "name": name,
                    "version": None if route is None else route.variant,
                    "state": "READY" if route is not None else "UNAVAILABLE",
                    "reason": "" if route is not None else "no live server holds it",
                    "server": None if route is None else route.server,
                    "kind": None if route is None else route.kind,
                    "degraded": bool(route and route.degraded),
                }
            )
        return out

    # the ASGI app --------------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        api = FastAPI(title="failsoft gateway", lifespan=self._lifespan, docs_url=None, redoc_url=None)
        _install_error_handlers(api)
        self._inference_routes(api)
        self._observability_routes(api)
        self._admin_routes(api)
        return api

    def _inference_routes(self, api: FastAPI) -> None:
        @api.get("/v2")
        async def server_metadata() -> dict[str, Any]:
            return {
                "name": "failsoft",
                "version": "0.1.0",
                "extensions": ["model_repository", "failsoft_events"],
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
            app = self._app(name)
            return model_metadata(name, app.family, self.models[app.family], self.variants[app.family])

        @api.get("/v2/models/{name}/ready")
        async def model_ready(name: str) -> Response:
            self._app(name)
            ok = self.mirror.route(name) is not None
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
            body = self.metrics.render(self.mirror.version, self.controller_stats)
            return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _stream_events(self, ws: WebSocket) -> None:
        only = ws.query_params.get("app")
        await ws.accept()
        queue = self.hub.subscribe()
        try:
            while True:
                event = await queue.get()
                if only is None or event.get("app") in (None, only):
                    await ws.send_json(event)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            self.hub.unsubscribe(queue)

    def _admin_routes(self, api: FastAPI) -> None:
        def guarded(path: str, method: str = "POST") -> Callable[[Any], Any]:
            def wrap(fn: Any) -> Any:
                async def endpoint(request: Request) -> Any:
                    self._check_admin(request)
                    body = await request.body() if method == "POST" else b""
                    return await fn(body)

                api.add_api_route(path, endpoint, methods=[method], name=fn.__name__)
                return fn

            return wrap

        @guarded("/admin/status", "GET")
        async def status(_: bytes) -> dict[str, Any]:
            body = await self.controller.status()
            body["gateway"] = {"route_version": self.mirror.version, "connected": self.mirror.connected}
            return body

        @guarded("/admin/recoveries", "GET")
        async def recoveries(_: bytes) -> dict[str, Any]:
            return {"recoveries": self.metrics.recovery_log, "events": list(self.hub.recent)}

        @guarded("/admin/chaos/kill")
        async def kill(body: bytes) -> dict[str, Any]:
            req = _parse(KillBody, body)
            if (req.server is None) == (req.site is None):
                raise InvalidRequestError("name exactly one of 'server' or 'site'")
            return await self.chaos.kill(req.server, req.site)

        @guarded("/admin/chaos/hang")
        async def hang(body: bytes) -> dict[str, Any]:
            return await self.chaos.hang(_parse(ServerBody, body).server)

        @guarded("/admin/chaos/resume")
        async def resume(body: bytes) -> dict[str, Any]:
            return await self.chaos.resume(_parse(ServerBody, body).server)

        @guarded("/admin/chaos/slow")
        async def slow(body: bytes) -> dict[str, Any]:
            req = _parse(SlowBody, body)
            return await self.chaos.slow(req.server, req.ms, req.load_ms)


def _header_length(request: Request) -> int | None:
    value = request.headers.get("inference-header-content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidRequestError(f"Inference-Header-Content-Length must be a number of bytes, got {value!r}")
    return int(value)


def _parse(model: type[BaseModel], body: bytes) -> Any:
    from pydantic import ValidationError

    from failsoft.scenario import describe_validation_error

    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise InvalidRequestError(f"bad admin request: {describe_validation_error(exc, None)}") from exc


def _status_of(exc: FailsoftError) -> int:
    if isinstance(exc, InvalidRequestError):
        return exc.status
    if isinstance(exc, ConfigError):
        return 404 if "unknown" in str(exc) else 400
    if isinstance(exc, (NoRouteError, ServerUnavailableError)):
        return 503
    if isinstance(exc, DeadlineExceededError):
        return 504
    return 500


def _install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(FailsoftError)
    async def failsoft_error(_: Request, exc: FailsoftError) -> JSONResponse:
        status = _status_of(exc)
        headers = {"Retry-After": "1"} if status == 503 else None
        if status >= 500:
            log.warning("request failed: %s", exc)
        return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)

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
