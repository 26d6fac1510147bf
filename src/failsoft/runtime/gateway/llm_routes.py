"""Triton's generate extension over the ``llm`` services, on the main gateway.

* ``POST /v2/models/{name}/generate``: ``{"text_input": "...", "parameters": {"max_tokens": 64,
  "temperature": 0, "seed": 0}}`` -> ``{"model_name", "text_output", "parameters": {worker,
  finish_reason, ttft_ms, tpot_ms, recoveries, output_tokens}}``;
* ``POST /v2/models/{name}/generate_stream``: the same request; the answer is a Server-Sent Events
  stream, one ``data: {"model_name", "text_output"}`` event per chunk of tokens as the worker
  produces them, and a last event with ``parameters`` as above. A client that disconnects ends its
  generation: the request is cancelled on its worker and its KV pages and checkpoint are freed;
* the OpenAI-compatible endpoints over the same services (``/v1/...``, ``docs/openai.md``).

The gateway tokenizes with the model's tokenizer (bytes for the byte-level pair, the model's own
for a Hugging Face one) and detokenizes incrementally: text is sent once it no longer ends in a
partial character. Bad input (a body over the limit, checked while it is read; a prompt over the
context, ``max_tokens`` 0 or over 4096, a sampling parameter out of range, an unknown one) is
answered 400 with the value named, before anything reaches a worker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from failsoft.errors import FailsoftError, InvalidRequestError, UnknownNameError, http_status
from failsoft.runtime.gateway.http_io import read_body
from failsoft.runtime.gateway.openai import openai_router

if TYPE_CHECKING:
    from failsoft.llm.tokens import Tokenizer
    from failsoft.runtime.gateway.llm_backend import LlmBackend

MAX_BODY = 2 << 20


class Detokenizer:
    """Token ids to text, incrementally: what the tokens so far decode to, less what was sent,
    held back while it ends in a partial character (U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = 0

    def feed(self, tokens: list[int], final: bool = False) -> str:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens)
        if not final and text.endswith("\ufffd"):
            return ""
        out, self.sent = text[self.sent :], len(text)
        return out


def _last_parameters(event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "worker": event.get("worker"),
        "finish_reason": event.get("reason"),
        "ttft_ms": event.get("ttft_ms"),
        "tpot_ms": event.get("tpot_ms"),
        "recoveries": event.get("recoveries", 0),
        "output_tokens": event.get("output_tokens", 0),
    }


async def _body(request: Request) -> tuple[str, dict[str, Any]]:
    """``text_input`` and ``parameters`` of a generate request, read within :data:`MAX_BODY`."""
    raw = await read_body(request, MAX_BODY)
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise InvalidRequestError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the body must be a JSON object")
    text = data.get("text_input")
    if not isinstance(text, str):
        raise InvalidRequestError(f"the body needs a string 'text_input'; got {type(text).__name__}")
    params = data.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequestError(f"parameters must be an object; got {params!r}")
    return text, {k: v for k, v in params.items() if k != "stream"}


def llm_router(backends: Mapping[str, LlmBackend]) -> APIRouter | None:
    """The endpoints of ``backends`` (service name -> its backend): Triton's generate extension
    and the OpenAI-compatible API (:func:`~failsoft.runtime.gateway.openai.openai_router`,
    ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``); None when there is none."""
    if not backends:
        return None
    router = APIRouter()
    router.include_router(openai_router(backends))

    def served(name: str) -> LlmBackend:
        d = backends.get(name)
        if d is None:
            known = ", ".join(sorted(backends))
            raise UnknownNameError(f"no llm service {name!r} (llm services: {known})")
        return d

    @router.post("/v2/models/{name}/generate")
    async def generate(name: str, request: Request) -> JSONResponse:
        d = served(name)
        text, params = await _body(request)
        events = d.generate(d.tokenizer.encode(text), params, uuid.uuid4().hex)
        tokens: list[int] = []
        last: dict[str, Any] = {}
        try:
            async for event in events:
                tokens.extend(event.get("tokens", ()))
                if event.get("finished"):
                    last = event
        finally:
            await _close(events)
        out = Detokenizer(d.tokenizer).feed(tokens, final=True)
        return JSONResponse({"model_name": name, "text_output": out, "parameters": _last_parameters(last)})

    @router.post("/v2/models/{name}/generate_stream")
    async def generate_stream(name: str, request: Request) -> StreamingResponse:
        d = served(name)
        text, params = await _body(request)
        # bad input: 400 now, not in the stream
        events = d.generate(d.tokenizer.encode(text), params, uuid.uuid4().hex)
        return StreamingResponse(_sse(name, d.tokenizer, events), media_type="text/event-stream")

    return router


async def _sse(
    name: str, tokenizer: Tokenizer, events: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[bytes]:
    text = Detokenizer(tokenizer)
    try:
        async for event in events:
            if event.get("finished"):
                out = {
                    "model_name": name,
                    "text_output": text.feed([], final=True),
                    "parameters": _last_parameters(event),
                }
            else:
                out = {"model_name": name, "text_output": text.feed(list(event["tokens"]))}
            yield f"data: {json.dumps(out)}\n\n".encode()
    except FailsoftError as exc:  # after the stream began: an error event, then the end
        yield f"data: {json.dumps({'error': str(exc), 'status': http_status(exc)})}\n\n".encode()
    finally:
        await _close(events)  # (a client gone: the generation's cleanup cancels it on its worker)


async def _close(events: AsyncIterator[Any]) -> None:
    """End a generation early (its clean-up cancels the request on its worker)."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


__all__ = ["Detokenizer", "llm_router"]
