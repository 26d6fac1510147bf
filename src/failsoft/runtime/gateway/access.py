"""Every HTTP request to the gateway: its id, its span, and its access-log line.

An ASGI middleware around the gateway's app (both planes), so that nothing a route does, raises or
streams escapes it:

* a **request id** (32 hex digits) for every HTTP request, set in
  :data:`failsoft.runtime.logs.request_id` for the request's task (every log record written while
  serving it carries it), answered in the ``X-Request-Id`` header, and used by the gateway as the
  request's id towards the agents (the calls they log and withdraw are named after it);
* the request's **span** (kind SERVER, :mod:`failsoft.runtime.telemetry`), child of the client's
  ``traceparent`` when it sent one; only when tracing is on;
* one **access-log line** on the ``failsoft.access`` logger at INFO, once the response is sent:
  ``POST /v2/models/cam/infer 200 3.1 ms service=cam request_id=...``, with ``method``, ``path``,
  ``status``, ``ms``, ``service`` (the service the URL names, ``-`` otherwise) and ``request_id``
  as fields of a JSON log line. A client that left before the answer is ``499``.

Websockets (``/v2/events``) get an id, not a line per message.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from failsoft.runtime import logs, telemetry
from failsoft.runtime.gateway.http_io import CLIENT_LEFT

access_log = logging.getLogger("failsoft.access")


class AccessMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = os.urandom(16).hex()  # a uuid4's hex costs 5x as much
        token = logs.request_id.set(rid)
        if scope["type"] != "http":
            try:
                await self.app(scope, receive, send)
            finally:
                logs.request_id.reset(token)
            return
        started = time.perf_counter()
        status = CLIENT_LEFT  # no response started: the client left (or the gateway stopped)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
            await send(message)

        async def serve() -> None:
            nonlocal status
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                status = 500
                raise

        try:
            if telemetry.enabled():
                with _span(scope) as span:
                    try:
                        await serve()
                    finally:
                        _end_span(span, scope, status)
            else:  # tracing off: nothing but the id and the line
                await serve()
        finally:
            _log(scope, status, (time.perf_counter() - started) * 1000.0, rid)
            logs.request_id.reset(token)


def _span(scope: Scope) -> Any:
    from opentelemetry.trace import SpanKind

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
    return telemetry.tracer().start_as_current_span(
        f"{scope['method']} {scope['path']}",
        context=telemetry.extract(headers),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
    )


def _end_span(span: Any, scope: Scope, status: int) -> None:
    from opentelemetry.trace import Status, StatusCode

    route = scope.get("route")
    template = getattr(route, "path", None)
    if template:
        span.update_name(f"{scope['method']} {template}")
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("failsoft.service", _service(scope))
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def _service(scope: Scope) -> str:
    return str(scope.get("path_params", {}).get("name", "-"))


def _log(scope: Scope, status: int, ms: float, rid: str) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    method, path, service = scope["method"], scope["path"], _service(scope)
    access_log.info(
        "%s %s %d %.1f ms service=%s request_id=%s",
        method,
        path,
        status,
        ms,
        service,
        rid,
        extra={
            "method": method,
            "path": path,
            "status": status,
            "ms": round(ms, 3),
            "service": service,
            "request_id": rid,
        },
    )
