"""Errors as OpenAI answers them: ``{"error": {"message", "type", "param", "code"}}``.

Every failure of an OpenAI endpoint leaves it in that shape, whatever the app it is mounted on
does with errors elsewhere: the router's :class:`OpenAiRoute` turns what a handler raises into
the error object (the ``openai`` client reads ``message`` and raises the class of the status:
400 ``BadRequestError``, 404 ``NotFoundError``, 503 ``InternalServerError`` and so on).

* a body that is not JSON, a field out of bounds, an unknown field, ``n`` other than 1: 400,
  ``invalid_request_error``, ``param`` the field;
* a body over the size limit: 413;
* a model not served: 404, code ``model_not_found``;
* failsoft errors by class (:func:`failsoft.errors.http_status`): no live worker (``NoRouteError``)
  and overload 503 with ``Retry-After``, a deadline missed 504; ``server_error``, ``code`` the
  error's class (``no_route``, ``overloaded``, ...).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from failsoft.errors import FailsoftError, InvalidRequestError, UnknownNameError, http_status
from failsoft.runtime.gateway.http_io import retry_after

log = logging.getLogger(__name__)


def error_object(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _code(exc: Exception) -> str:
    """``NoRouteError`` -> ``no_route``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__.removesuffix("Error")).lower()


def failsoft_error(exc: FailsoftError) -> tuple[int, dict[str, Any]]:
    """The status and error object of a failsoft error."""
    status = http_status(exc)
    if isinstance(exc, UnknownNameError):
        return status, error_object(str(exc), "invalid_request_error", "model", "model_not_found")
    if status < 500:
        param = exc.param if isinstance(exc, InvalidRequestError) else None
        return status, error_object(str(exc), "invalid_request_error", param)
    return status, error_object(str(exc), "server_error", None, _code(exc))


def validation_error(exc: ValidationError) -> dict[str, Any]:
    """The first problem pydantic found, in OpenAI's words where OpenAI has some."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"{param}: {first['msg'].removeprefix('Value error, ')}" if param else first["msg"]
    return error_object(message, "invalid_request_error", param)


def error_response(exc: Exception) -> JSONResponse:
    """The response for anything a handler raised."""
    headers: dict[str, str] | None = None
    if isinstance(exc, FailsoftError):
        status, body = failsoft_error(exc)
        headers = retry_after(exc)
        if status >= 500:
            log.warning("OpenAI request failed: %s", exc)
    elif isinstance(exc, ValidationError):
        status, body = 400, validation_error(exc)
    elif isinstance(exc, HTTPException):
        status, body = exc.status_code, error_object(str(exc.detail), "invalid_request_error")
    else:
        log.exception("unhandled error in an OpenAI endpoint")
        status, body = 500, error_object(f"internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(body, status_code=status, headers=headers)


class OpenAiRoute(APIRoute):
    """A route whose every failure is answered with OpenAI's error object (the app's own
    exception handlers, which answer in the KServe shape, never see them)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return error_response(exc)

        return guarded
