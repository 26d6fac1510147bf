"""A real :class:`failsoft.llm.Engine` served in-process as an
:class:`~failsoft.runtime.gateway.llm_backend.LlmBackend`: what the OpenAI endpoints are tested
against without Ray. The ``llm`` dispatcher runs the same engine in worker actors; here the
engine steps on the server's own event loop, between the awaits of the requests it serves.

``down`` stands for a service whose workers are all dead (:class:`NoRouteError`) and
``fail_after_tokens`` for a stream whose recovery failed (:class:`ServingError` after that many
tokens), which an in-process engine cannot be; ``step_delay_s`` slows generation so that a test
can leave a stream before it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from failsoft.errors import NoRouteError, ServingError
from failsoft.llm import Engine, SamplingParams
from failsoft.llm.engine import Request
from failsoft.llm.tokens import Tokenizer


class EngineBackend:
    def __init__(self, model_id: str, engine: Engine, step_delay_s: float = 0.0) -> None:
        self.model_id = model_id
        self.engine = engine
        self.step_delay_s = step_delay_s
        self.down = False
        self.fail_after_tokens: int | None = None
        self.peak_batch = 0  # the most requests one engine step ran
        self.requests: dict[str, Request] = {}  # every request it was given, finished ones too
        self._work: asyncio.Event | None = None
        self._tick: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def context(self) -> int:
        return self.engine.context

    async def generate(
        self, tokens: Sequence[int], sampling: Mapping[str, Any], request_id: str
    ) -> AsyncIterator[dict[str, Any]]:
        if self.down:
            raise NoRouteError(f"service {self.model_id!r} has no live worker")
        req = self.engine.submit(list(tokens), SamplingParams(**sampling), request_id=request_id)
        self.requests[request_id] = req
        self._start()
        sent = 0
        try:
            while True:
                if self.fail_after_tokens is not None and sent >= self.fail_after_tokens:
                    raise ServingError(
                        f"request {request_id!r}: its worker failed and no other could take it"
                    )
                if sent < len(req.output):
                    new, sent = req.output[sent:], len(req.output)
                    yield {"tokens": new}
                elif req.finished:
                    reason = "stop" if req.finish_reason == "eos" else req.finish_reason
                    yield {"finished": True, "reason": reason, "output_tokens": len(req.output)}
                    return
                else:
                    assert self._tick is not None
                    await self._tick.wait()
        finally:  # closed early (a stop string, a client gone): cancelled, its pages freed
            if not req.finished:
                self.engine.cancel(req.id)

    def _start(self) -> None:
        if self._driver is None:
            self._work, self._tick = asyncio.Event(), asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        assert self._work is not None
        self._work.set()

    async def _drive(self) -> None:
        assert self._work is not None and self._tick is not None
        while True:
            if self.engine.idle():
                self._work.clear()
                await self._work.wait()
            self.peak_batch = max(self.peak_batch, self.engine.running)
            self.engine.step()
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()
            await asyncio.sleep(self.step_delay_s)
