"""A request's work, abandoned when its client disconnects first (the KServe and OpenAI endpoints).

Starlette does not cancel a handler whose client has gone: the work would run to the end for
nobody (a model call queued on a server, an LLM generation holding KV pages). A handler awaits
its work through :func:`unless_the_client_leaves` instead, which watches the connection and
cancels the work when it closes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import anyio
from fastapi import Request

T = TypeVar("T")
CLIENT_LEFT = 499  # nginx's code for a request whose client closed the connection first


async def unless_the_client_leaves(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnected first: the work is then cancelled
    (a dispatch withdraws its calls from the servers' queues: nobody would read the answer)."""
    result: T | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            # the body is read: the next message is the disconnect (or comes after the response)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        try:
            result = await work
        except Exception as exc:  # raised past the group, not wrapped in an ExceptionGroup
            error = exc
        tasks.cancel_scope.cancel()
    if error is not None:
        raise error
    return result
