"""One generation through an :class:`~failsoft.runtime.gateway.llm_backend.LlmBackend`: its text
pieces, its finish reason and its token counts, whether it is streamed or answered whole.

The first backend event is awaited before anything is answered (:meth:`Generation.begin`), so
that a request the backend refuses (a token outside the vocabulary, no live worker) gets its HTTP
status rather than a stream that starts and then fails. Afterwards :meth:`Generation.next_piece`
reads events and returns text (decoded incrementally, cut at a stop string). Closing the backend's
generator is how a request ends early, at a stop string or when the client leaves: the backend
then cancels it on its worker and frees its KV pages. :meth:`Generation.close` does it shielded
from cancellation (a disconnected client's handler is being cancelled while it cleans up, and
anyio would cancel the cleanup's own awaits too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio

from failsoft.errors import ServingError
from failsoft.runtime.gateway.llm_backend import LlmBackend
from failsoft.runtime.gateway.openai.text import Piece, TextStream

REASONS = {"stop": "stop", "eos": "stop", "length": "length"}  # the backend's -> OpenAI's


class Generation:
    """A request on its way; ``finish_reason`` is set once :meth:`next_piece` returns None."""

    def __init__(
        self,
        backend: LlmBackend,
        prompt: Sequence[int],
        sampling: Mapping[str, Any],
        request_id: str,
        stops: Sequence[str],
    ) -> None:
        self.id = request_id
        self.prompt_tokens = len(prompt)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._text = TextStream(backend.tokenizer, prompt, stops)
        self._events: AsyncIterator[dict[str, Any]] = backend.generate(prompt, sampling, request_id)
        self._next: dict[str, Any] | None = None
        self._closed = False

    async def begin(self) -> None:
        """Wait for the backend's first event: what the backend raises is raised here."""
        try:
            self._next = await self._read()
        except BaseException:
            await self.close()
            raise

    async def _read(self) -> dict[str, Any]:
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            raise ServingError(f"request {self.id!r}: the model's stream ended unfinished") from None

    async def next_piece(self) -> str | None:
        """The next piece of text (possibly empty), or None at the end."""
        if self.finish_reason is not None:
            return None
        event = self._next if self._next is not None else await self._read()
        self._next = None
        tokens = event.get("tokens", ())
        self.completion_tokens += len(tokens)
        piece = self._text.feed(tokens) if tokens else Piece("")
        if piece.stopped:
            self.finish_reason = "stop"
            await self.close()  # the backend cancels the request: nothing after the stop is wanted
        elif event.get("finished"):
            last = self._text.finish()
            reason = str(event.get("reason", "stop"))
            self.finish_reason = "stop" if last.stopped else REASONS.get(reason, reason)
            await self.close()
            return piece.text + last.text
        return piece.text

    async def text(self) -> str:
        """All of it (the answer of a request that is not streamed)."""
        parts = []
        while (piece := await self.next_piece()) is not None:
            parts.append(piece)
        return "".join(parts)

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def close(self) -> None:
        """End it here (the backend cancels the request, if it still runs); idempotent."""
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
