"""The answers of ``/v1/completions`` and ``/v1/chat/completions``, whole and streamed, in OpenAI's
shapes (``text_completion``; ``chat.completion`` and ``chat.completion.chunk``).

A stream is what OpenAI sends: ``data: {chunk}`` events, the chat's first chunk carrying
``{"role": "assistant"}``, text deltas, a last chunk with an empty delta and the
``finish_reason``, then, when ``stream_options.include_usage`` asked for it, a chunk with no
choices and the ``usage`` (every other chunk then has ``"usage": null``), and ``data: [DONE]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass(frozen=True)
class Shape:
    """The answers of one request (``id``, ``created`` and ``model`` are on every one)."""

    chat: bool
    id: str
    created: int
    model: str
    include_usage: bool = False

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason)
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice.update(logprobs=None, finish_reason=finish_reason)
        body = {
            **self._head("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [choice],
        }
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def first(self) -> bytes | None:
        """The chat's opening chunk (the role, empty content); a completion has none."""
        return self.chunk("", role=True) if self.chat else None

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": usage})
