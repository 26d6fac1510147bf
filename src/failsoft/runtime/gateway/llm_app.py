"""The LLM gateway: Triton's generate extension over the ``llm`` services (LUMEN).

* ``POST /v2/models/{name}/generate``: ``{"text_input": "...", "parameters": {"max_tokens": 64,
  "temperature": 0, "seed": 0}}`` -> ``{"model_name", "text_output", "parameters": {worker,
  finish_reason, ttft_ms, tpot_ms, recoveries, output_tokens}}``;
* ``POST /v2/models/{name}/generate_stream``: the same request; the answer is a Server-Sent Events
  stream, one ``data: {"model_name", "text_output"}`` event per chunk of tokens as the worker
  produces them, and a last event with ``parameters`` as above. A client that disconnects ends its
  generation: the request is cancelled on its worker and its KV pages and checkpoint are freed;
* ``GET /v2/models/{name}/ready``, ``/v2/health/ready`` and ``/live``, ``/v2/repository/index``.

Bad input (prompt over the context, ``max_tokens`` 0 or over 4096, a sampling parameter out of
range, an unknown one) is answered 400 with the value named, before anything reaches a worker.
Tokens are bytes: a UTF-8 character split across two events is held back until it is whole.
"""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from failsoft.errors import FailsoftError, InvalidRequestError, UnknownNameError
from failsoft.llm.corpus import BYTE_TOKENS
from failsoft.runtime.gateway.app import _error_response, _install_error_handlers
from failsoft.runtime.gateway.dispatch.llm import LlmDispatcher

log = logging.getLogger(__name__)
MAX_BODY = 2 << 20


class TextDecoder:
    """Byte tokens to text, incrementally (a character split across chunks waits to be whole)."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: list[int], final: bool = False) -> str:
        return self._dec.decode(bytes(t for t in tokens if t < BYTE_TOKENS), final=final)


def _last_parameters(event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "worker": event.get("worker"),
        "finish_reason": event.get("reason"),
        "ttft_ms": event.get("ttft_ms"),
        "tpot_ms": event.get("tpot_ms"),
        "recoveries": event.get("recoveries", 0),
        "output_tokens": event.get("output_tokens", 0),
    }


def build_llm_app(dispatchers: Mapping[str, LlmDispatcher]) -> FastAPI:
    """The FastAPI app serving ``dispatchers`` (service name -> dispatcher)."""
    api = FastAPI(title="failsoft llm gateway")
    _install_error_handlers(api)

    def served(name: str) -> LlmDispatcher:
        d = dispatchers.get(name)
        if d is None:
            raise UnknownNameError(f"no model {name!r} (served: {', '.join(sorted(dispatchers))})")
        return d

    async def parse(request: Request) -> tuple[Any, dict[str, Any]]:
        body = await request.body()
        if len(body) > MAX_BODY:
            raise InvalidRequestError(f"the body has {len(body)} bytes; at most {MAX_BODY}")
        try:
            data = json.loads(body or b"{}")
        except ValueError as exc:
            raise InvalidRequestError(f"the body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidRequestError("the body must be a JSON object")
        if "text_input" not in data:
            raise InvalidRequestError("the body has no 'text_input'")
        params = data.get("parameters", {})
        if not isinstance(params, dict):
            raise InvalidRequestError(f"parameters must be an object; got {params!r}")
        params = {k: v for k, v in params.items() if k != "stream"}
        return data["text_input"], params

    @api.get("/v2/health/live")
    async def live() -> dict[str, Any]:
        return {"live": True}

    @api.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = all(d.ready() for d in dispatchers.values())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @api.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> JSONResponse:
        ok = served(name).ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @api.get("/v2/repository/index")
    async def index() -> list[dict[str, Any]]:
        return [d.describe() for d in dispatchers.values()]

    @api.post("/v2/models/{name}/generate")
    async def generate(name: str, request: Request) -> JSONResponse:
        d = served(name)
        prompt, params = await parse(request)
        events = d.generate(prompt, params)
        tokens: list[int] = []
        last: dict[str, Any] = {}
        try:
            async for event in events:
                tokens.extend(event.get("tokens", ()))
                if event.get("finished"):
                    last = event
        finally:
            await events.aclose()
        text = TextDecoder().feed(tokens, final=True)
        return JSONResponse({"model_name": name, "text_output": text, "parameters": _last_parameters(last)})

    @api.post("/v2/models/{name}/generate_stream")
    async def generate_stream(name: str, request: Request) -> Any:
        d = served(name)
        prompt, params = await parse(request)
        d.check(prompt, params)  # bad input: 400 now, not inside the stream
        events = d.generate(prompt, params)
        return StreamingResponse(_sse(name, events), media_type="text/event-stream")

    return api


async def _sse(name: str, events: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[bytes]:
    decoder = TextDecoder()
    try:
        async for event in events:
            if event.get("finished"):
                tail = decoder.feed([], final=True)
                out = {"model_name": name, "text_output": tail, "parameters": _last_parameters(event)}
            else:
                out = {"model_name": name, "text_output": decoder.feed(list(event["tokens"]))}
            yield f"data: {json.dumps(out)}\n\n".encode()
    except FailsoftError as exc:  # after the stream began: an error event, then the end
        response = _error_response(exc)
        yield f"data: {json.dumps({'error': str(exc), 'status': response.status_code})}\n\n".encode()
    finally:
        await events.aclose()  # (a client gone: generate's cleanup cancels it on its worker)
