"""The gateway's admin API: bearer-token protected, size-limited, and every action logged.

``GET /admin/status`` and ``GET /admin/recoveries`` read; ``POST
/admin/chaos/{kill,hang,resume,slow,break,evict}`` inject failures. Every request must carry
``Authorization: Bearer <token>`` (compared in constant time); a refused one is logged at WARNING
with the peer's address, an accepted action at INFO with who (the peer) and what (the path and
its request), reads at DEBUG. Bodies are JSON objects of at most :data:`ADMIN_BODY_BYTES`.

The routes reach the gateway through :class:`AdminHost`, the few parts of it they use, so that this
module does not import the gateway that installs it (:class:`~failsoft.runtime.gateway.app.Gateway`
is one).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from failsoft.errors import InvalidRequestError
from failsoft.runtime.gateway.protocol import show

if TYPE_CHECKING:
    from failsoft.runtime.chaos import Chaos
    from failsoft.runtime.cluster import ControllerRef
    from failsoft.runtime.gateway.events import EventHub
    from failsoft.runtime.gateway.link import ControllerLink
    from failsoft.runtime.gateway.metrics import GatewayMetrics
    from failsoft.runtime.gateway.routes import RouteMirror

log = logging.getLogger(__name__)
ADMIN_BODY_BYTES = 16 * 1024
DEPLOY_BODY_BYTES = 1024 * 1024  # a config (failsoft deploy) is larger than the other admin bodies


class AdminHost(Protocol):
    """What the admin routes use of the gateway: its token, body reader, controller and chaos, and the
    parts ``GET /admin/status`` and ``GET /admin/recoveries`` report on."""

    @property
    def admin_token(self) -> str: ...
    @property
    def controller(self) -> ControllerRef: ...
    @property
    def chaos(self) -> Chaos: ...
    @property
    def mirror(self) -> RouteMirror: ...
    @property
    def link(self) -> ControllerLink: ...
    @property
    def hub(self) -> EventHub: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def deployer(self) -> Any: ...
    async def read_body(self, request: Request, limit: int) -> bytes: ...


class DeployBody(BaseModel):
    """``failsoft deploy``: the config (parsed YAML), where it came from, and whether to only plan."""

    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any]
    source: str = Field(default="deploy", max_length=4096)
    base_dir: str | None = Field(default=None, max_length=4096)
    dry_run: bool = False


class LoadParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int | None = Field(default=None, ge=1, le=1_000_000)


class LoadBody(BaseModel):
    """Triton's repository load request; ``parameters.version`` (failsoft's) picks the version to
    roll out, the latest in the repository when absent."""

    model_config = ConfigDict(extra="forbid")
    parameters: LoadParameters = Field(default_factory=LoadParameters)


class KillBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str | None = None
    site: str | None = None
    servers: list[str] | None = Field(default=None, min_length=1, max_length=1024)  # killed at one instant


class ServerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str


class SlowBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str
    ms: float = Field(ge=0, le=600_000)
    load_ms: float | None = Field(default=None, ge=0, le=600_000)


class BreakBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str
    broken: bool = True


class EvictBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str
    app: str = Field(min_length=1, max_length=256)


def peer(request: Request) -> str:
    client = request.client
    return "unknown peer" if client is None else f"{client.host}:{client.port}"


def parse(model: type[BaseModel], body: bytes) -> Any:
    from failsoft.bounds import describe_validation_error

    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise InvalidRequestError(f"bad admin request: {describe_validation_error(exc, None)}") from exc


def check_token(request: Request, token: str) -> None:
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {token}".encode()):
        what = f"{request.method} {request.url.path}"
        log.warning("admin %s refused: no valid token, from %s", what, peer(request))
        raise InvalidRequestError("admin endpoints need 'Authorization: Bearer <token>'", 401)


def install(api: FastAPI, gateway: AdminHost) -> None:
    """Add the admin routes of ``gateway`` to ``api``."""

    def guarded(path: str, method: str = "POST", limit: int = ADMIN_BODY_BYTES) -> Callable[[Any], Any]:
        def wrap(fn: Callable[..., Awaitable[Any]]) -> Any:
            async def endpoint(request: Request) -> Any:
                check_token(request, gateway.admin_token)
                body = await gateway.read_body(request, limit) if method == "POST" else b""
                level = logging.INFO if method == "POST" else logging.DEBUG
                what = (
                    show(body.decode("utf-8", "replace"))
                    if limit == ADMIN_BODY_BYTES
                    else f"{len(body)} bytes"
                )
                log.log(level, "admin %s %s by %s: %s", method, request.url.path, peer(request), what)
                return await fn(body, **request.path_params)

            api.add_api_route(path, endpoint, methods=[method], name=fn.__name__)
            return fn

        return wrap

    @guarded("/admin/status", "GET")
    async def status(_: bytes) -> dict[str, Any]:
        body = await gateway.controller.status()
        body["gateway"] = {
            "route_version": gateway.mirror.version,
            "route_epoch": gateway.mirror.epoch,
            "routes_taken": dict(gateway.mirror.taken),  # tables by the path that brought them first
            "connected": gateway.link.connected,
            "event_subscribers": gateway.hub.subscribers,
        }
        return body

    def deployer() -> Any:
        if gateway.deployer is None:
            raise InvalidRequestError("this gateway takes no deploys", 404)
        return gateway.deployer

    @guarded("/admin/deploy", "POST", DEPLOY_BODY_BYTES)
    async def deploy(body: bytes) -> dict[str, Any]:
        req = parse(DeployBody, body)
        return dict(await deployer().deploy(req.config, req.source, req.base_dir, req.dry_run))

    @guarded("/admin/deploy", "GET")
    async def deploy_status(_: bytes) -> dict[str, Any]:
        return dict(await deployer().status())

    # Triton's model control (the repository extension), on the admin plane only: it changes what runs
    @guarded("/v2/repository/models/{name}/load")
    async def load_model(body: bytes, name: str) -> dict[str, Any]:
        version = parse(LoadBody, body).parameters.version
        return dict(await deployer().load_model(name, version))

    @guarded("/v2/repository/models/{name}/unload")
    async def unload_model(body: bytes, name: str) -> dict[str, Any]:
        parse(LoadBody, body)
        return dict(await deployer().unload_model(name))

    @guarded("/admin/recoveries", "GET")
    async def recoveries(_: bytes) -> dict[str, Any]:
        return {
            "recoveries": list(gateway.metrics.recovery_log),
            "moves": list(gateway.metrics.move_log),
            "events": list(gateway.hub.recent),
        }

    @guarded("/admin/chaos/kill")
    async def kill(body: bytes) -> dict[str, Any]:
        req = parse(KillBody, body)
        if [req.server, req.site, req.servers].count(None) != 2:
            raise InvalidRequestError("name exactly one of 'server', 'servers' or 'site'")
        return await gateway.chaos.kill(req.server, req.site, req.servers)

    @guarded("/admin/chaos/hang")
    async def hang(body: bytes) -> dict[str, Any]:
        return await gateway.chaos.hang(parse(ServerBody, body).server)

    @guarded("/admin/chaos/resume")
    async def resume(body: bytes) -> dict[str, Any]:
        return await gateway.chaos.resume(parse(ServerBody, body).server)

    @guarded("/admin/chaos/break")
    async def break_(body: bytes) -> dict[str, Any]:
        req = parse(BreakBody, body)
        return await gateway.chaos.break_(req.server, req.broken)

    @guarded("/admin/chaos/evict")
    async def evict(body: bytes) -> dict[str, Any]:
        req = parse(EvictBody, body)
        return await gateway.chaos.evict(req.server, req.app)

    @guarded("/admin/chaos/slow")
    async def slow(body: bytes) -> dict[str, Any]:
        req = parse(SlowBody, body)
        return await gateway.chaos.slow(req.server, req.ms, req.load_ms)
