"""HTTP plumbing that the KServe and the OpenAI endpoints share.

* :func:`read_body`: a body read with a size limit, refused (413) as soon as it passes it, not
  once it is all in memory;
* :func:`unless_the_client_leaves`: Starlette does not cancel a handler whose client has gone, so
  the work would run to the end for nobody (a model call queued on a server, an LLM generation
  holding KV pages); a handler awaits its work through it instead, and the work is cancelled when
  the connection closes;
* :func:`retry_after`: the ``Retry-After`` header of a refusal a client should retry (503).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from failsoft.errors import FailsoftError, InvalidRequestError, OverloadedError, http_status

T = TypeVar("T")
CLIENT_LEFT = 499  # nginx's code for a request whose client closed the connection first


def byte_count(value: str | None, header: str) -> int | None:
    """A header that counts bytes: ASCII digits only (``"²".isdigit()`` is true, ``int("²")`` fails)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise InvalidRequestError(f"{header} must be a number of bytes, got {value[:40]!r}")
    return int(value)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes, whatever Content-Length claims."""
    declared = byte_count(request.headers.get("content-length"), "Content-Length")
    if declared is not None and declared > limit:
        raise InvalidRequestError(f"request body of {declared} bytes exceeds the limit of {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidRequestError(f"request body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def retry_after(exc: FailsoftError) -> dict[str, str] | None:
    """``Retry-After`` for a 503: the queue's own estimate when it is overloaded, else 1 s."""
    if isinstance(exc, OverloadedError):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    if http_status(exc) == 503:
        return {"Retry-After": "1"}
    return None


async def unless_the_client_leaves(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnected first: the work is then cancelled
    (a dispatch withdraws its calls from the servers' queues: nobody would read the answer).

    The work runs in the caller's task; one plain task watches the connection and cancels the
    caller's task when the client leaves (a task group per request cost more than the rest of the
    gateway's own work on a small model)."""
    task = asyncio.current_task()
    assert task is not None, "called outside a task"
    left = False

    def client_left(watch: asyncio.Future[None]) -> None:
        nonlocal left
        if not watch.cancelled() and watch.exception() is None:
            left = True
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(client_left)
    try:
        return await work
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:  # our own cancellation, no other pending: the client left
            return None
        raise
    finally:
        watcher.remove_done_callback(client_left)
        watcher.cancel()


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects: the body is read, so the next message is the
    disconnect (or comes after the response)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
