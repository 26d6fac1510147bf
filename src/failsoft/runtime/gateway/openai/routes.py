"""The OpenAI-compatible endpoints as a FastAPI router over one backend per served model id.

* ``GET /v1/models`` and ``GET /v1/models/{model}``: the served models (``max_model_len``: the
  context in tokens);
* ``POST /v1/completions``: a prompt (text, or token ids) continued;
* ``POST /v1/chat/completions``: messages rendered by the model's tokenizer (its chat template;
  the byte-level pair's ``role: content`` lines), answered as the assistant's message.

The router tokenizes, checks that prompt and ``max_tokens`` fit the context (without a limit, a
chat may fill it and a completion takes 16 tokens, as OpenAI's), hands token ids to the backend,
and answers as OpenAI does, whole or streamed (:mod:`.shapes`). A request not streamed is
abandoned, and the backend's request cancelled, when its client disconnects; a stream likewise.
Sampling follows OpenAI's defaults: ``temperature`` 1 when not given (0 for greedy), and a seed
drawn at random for each request that samples without one.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from failsoft.errors import FailsoftError, InvalidRequestError, UnknownNameError
from failsoft.llm.engine import MAX_TOKENS_BOUND
from failsoft.runtime.gateway.http_io import CLIENT_LEFT, read_body, unless_the_client_leaves
from failsoft.runtime.gateway.llm_backend import LlmBackend
from failsoft.runtime.gateway.openai.errors import OpenAiRoute, failsoft_error
from failsoft.runtime.gateway.openai.generation import Generation
from failsoft.runtime.gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from failsoft.runtime.gateway.openai.shapes import DONE, Shape, sse

MAX_BODY_BYTES = 2 << 20
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def openai_router(backends: Mapping[str, LlmBackend], max_body_bytes: int = MAX_BODY_BYTES) -> APIRouter:
    """The ``/v1`` endpoints serving ``backends`` (model id -> backend; read at each request, so a
    mapping that changes serves what it holds then)."""
    router = APIRouter(route_class=OpenAiRoute, tags=["OpenAI"])
    created = int(time.time())

    def served(model: str) -> LlmBackend:
        backend = backends.get(model)
        if backend is None:
            known = ", ".join(sorted(backends)) or "none"
            raise UnknownNameError(f"The model `{model}` does not exist (served: {known})")
        return backend

    def card(model: str, backend: LlmBackend) -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "failsoft",
            "max_model_len": backend.context,
        }

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card(m, b) for m, b in list(backends.items())]}

    @router.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict[str, Any]:
        return card(model, served(model))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = CompletionRequest.model_validate_json(await read_body(request, max_body_bytes))
        backend = served(body.model)
        prompt = body.one_prompt
        ids = backend.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        sampling = _sampling(backend, ids, body, body.max_tokens, "max_tokens", "prompt")
        return await _answer(request, backend, ids, sampling, body, Shape(False, *_head("cmpl", body)))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = ChatCompletionRequest.model_validate_json(await read_body(request, max_body_bytes))
        backend = served(body.model)
        ids = backend.tokenizer.chat([{"role": m.role, "content": m.text} for m in body.messages])
        field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        sampling = _sampling(backend, ids, body, body.limit, field, "messages")
        return await _answer(request, backend, ids, sampling, body, Shape(True, *_head("chatcmpl", body)))

    return router


def _head(prefix: str, body: ChatCompletionRequest | CompletionRequest) -> tuple[str, int, str, bool]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time()), body.model, body.include_usage


def _sampling(
    backend: LlmBackend,
    prompt: Sequence[int],
    body: ChatCompletionRequest | CompletionRequest,
    limit: int | None,
    limit_field: str,
    prompt_field: str,
) -> dict[str, Any]:
    """The backend's sampling fields; the prompt and the output must fit the context."""
    context, n = backend.context, len(prompt)
    if n == 0:
        raise InvalidRequestError("the prompt is empty", param=prompt_field)
    if n >= context:
        raise InvalidRequestError(
            f"This model's maximum context length is {context} tokens; the {prompt_field} has {n}",
            param=prompt_field,
        )
    if limit is None:
        limit = min(
            context - n, COMPLETION_MAX_TOKENS if isinstance(body, CompletionRequest) else MAX_TOKENS_BOUND
        )
    elif limit > MAX_TOKENS_BOUND:
        raise InvalidRequestError(
            f"{limit_field} must be at most {MAX_TOKENS_BOUND}; got {limit}", param=limit_field
        )
    elif n + limit > context:
        raise InvalidRequestError(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{n + limit} tokens ({n} in the {prompt_field}, {limit} for the completion)",
            param=limit_field,
        )
    temperature = 1.0 if body.temperature is None else body.temperature
    sampling: dict[str, Any] = {"max_tokens": limit, "temperature": temperature}
    if body.top_p is not None:
        sampling["top_p"] = body.top_p
    if body.seed is not None or temperature > 0:
        sampling["seed"] = body.seed if body.seed is not None else secrets.randbits(63)
    return sampling


async def _answer(
    request: Request,
    backend: LlmBackend,
    prompt: list[int],
    sampling: dict[str, Any],
    body: ChatCompletionRequest | CompletionRequest,
    shape: Shape,
) -> Response:
    gen = Generation(backend, prompt, sampling, shape.id, body.stops)
    try:
        if body.stream:
            if await unless_the_client_leaves(request, _started(gen)):
                return EventStream(_events(gen, shape), gen.close)
        else:
            text = await unless_the_client_leaves(request, _whole(gen))
            if text is not None:
                return JSONResponse(shape.whole(text, gen.finish_reason, gen.usage))
    except BaseException:
        await gen.close()
        raise
    await gen.close()
    return Response(status_code=CLIENT_LEFT)  # the client left: nobody reads it


async def _started(gen: Generation) -> bool:
    await gen.begin()
    return True


async def _whole(gen: Generation) -> str:
    await gen.begin()
    return await gen.text()


async def _events(gen: Generation, shape: Shape) -> AsyncGenerator[bytes, None]:
    try:
        if (first := shape.first()) is not None:
            yield first
        while (piece := await gen.next_piece()) is not None:
            if piece:
                yield shape.chunk(piece)
        yield shape.chunk(finish_reason=gen.finish_reason)
        if shape.include_usage:
            yield shape.usage_chunk(gen.usage)
        yield DONE
    except FailsoftError as exc:  # after the stream began: OpenAI's error as an event, then the end
        yield sse(failsoft_error(exc)[1])
    finally:
        await gen.close()


class EventStream(StreamingResponse):
    """Server-sent events that end their generation however the response ends (a client that
    disconnects included, even before the first event), so that the backend's request is always
    finished or cancelled."""

    def __init__(self, events: AsyncGenerator[bytes, None], close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events, self._close = events, close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                await self._close()
