"""The client endpoints of ``slo`` services (Jellyfish): register, report bandwidth, leave.

The ``slo`` dispatcher serves them (:meth:`SloDispatcher.http_routes
<failsoft.runtime.gateway.dispatch.slo.SloDispatcher.http_routes>`); the gateway includes them
without knowing the mode.

* ``POST /v2/clients`` with ``{"service": NAME, "slo_ms": 100, "fps": 15}`` (optional: ``slo_ms``,
  default the service's ``params.slo_ms``; ``bandwidth_kbps``, the client's first estimate, default
  20000; ``rtt_ms``, default 1) answers
  ``{"client": ID, "service", "slo_ms", "fps", "worker", "variant", "frame_px"}``: the id to send
  with every frame, the worker and variant it is mapped to now (``null``: no variant fits its budget
  at the moment) and the frame size to send first;
* ``POST /v2/clients/{id}/bandwidth`` with ``{"bandwidth_kbps": 25000}``: a measured uplink
  bandwidth (the same field may ride on every infer request's ``parameters`` instead);
* ``DELETE /v2/clients/{id}``: the client leaves (its share of the workers is re-planned at once).

A value out of bounds (an SLO that even the fastest variant cannot meet, a frame rate of 0, a
negative or absurd bandwidth, an unknown service) is refused with a 4xx whose ``error`` names the
field and the value; nothing else changes for the other clients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from fastapi import APIRouter, Request

from failsoft.errors import InvalidRequestError, UnknownNameError

MAX_BODY_BYTES = 4096
FIELDS = frozenset({"service", "slo_ms", "fps", "bandwidth_kbps", "rtt_ms"})


class ClientRegistry(Protocol):
    """What these endpoints need of an slo service (its dispatcher): its clients, by id."""

    @property
    def clients(self) -> Mapping[str, Any]: ...

    async def register(
        self, slo_ms: Any, fps: Any, bandwidth_kbps: Any = None, rtt_ms: Any = None
    ) -> dict[str, Any]: ...

    def report_bandwidth(self, client_id: str, kbps: Any) -> dict[str, Any]: ...

    async def unregister(self, client_id: str) -> None: ...


def router(services: Mapping[str, ClientRegistry]) -> APIRouter:
    """The client endpoints of ``services`` (service name -> its registry), one set for all."""
    api = APIRouter()

    def owner(client_id: str) -> ClientRegistry:
        for dispatcher in services.values():
            if client_id in dispatcher.clients:
                return dispatcher
        raise UnknownNameError(
            f"client {client_id[:40]!r} is not registered (register with POST /v2/clients)"
        )

    @api.post("/v2/clients")
    async def register(request: Request) -> dict[str, Any]:
        body = await _body(request)
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise InvalidRequestError(f"unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})")
        name = body.get("service")
        if not isinstance(name, str):
            raise InvalidRequestError(f"'service' must name an slo service; got {str(name)[:40]!r}")
        dispatcher = services.get(name)
        if dispatcher is None:
            known = ", ".join(sorted(services)) or "none"
            raise UnknownNameError(f"unknown slo service {name[:40]!r} (slo services: {known})")
        if "fps" not in body:
            raise InvalidRequestError("'fps' is required")
        return await dispatcher.register(
            body.get("slo_ms"), body["fps"], body.get("bandwidth_kbps"), body.get("rtt_ms")
        )

    @api.post("/v2/clients/{client_id}/bandwidth")
    async def bandwidth(client_id: str, request: Request) -> dict[str, Any]:
        body = await _body(request)
        if "bandwidth_kbps" not in body:
            raise InvalidRequestError("'bandwidth_kbps' is required")
        return owner(client_id).report_bandwidth(client_id, body["bandwidth_kbps"])

    @api.delete("/v2/clients/{client_id}")
    async def leave(client_id: str) -> dict[str, Any]:
        await owner(client_id).unregister(client_id)
        return {"client": client_id, "left": True}

    return api


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidRequestError(
            f"request body of {len(raw)} bytes exceeds the limit of {MAX_BODY_BYTES}", 413
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return body
