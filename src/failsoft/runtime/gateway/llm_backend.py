"""What the OpenAI-compatible endpoints ask of an LLM service: the seam between the API layer
(request models, chat templates, server-sent events, stop strings, OpenAI's error objects) and the
``llm`` mode's dispatcher (workers, KV checkpoints, LUMEN's recovery).

The API layer tokenizes (a completion's prompt, or a chat through the model's template), hands the
token ids to :meth:`LlmBackend.generate`, detokenizes what comes back incrementally, and stops the
stream itself at a stop string (closing the generator; the backend then cancels the request on its
worker and frees its KV pages, as when a client leaves). The backend never sees text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from failsoft.llm.tokens import Tokenizer


class LlmBackend(Protocol):
    """One served model, as ``/v1/models`` lists it (``model_id``: the ``llm`` service's name).

    :meth:`generate` yields events: ``{"tokens": [int, ...]}`` as tokens come (one or more each),
    then one last ``{"finished": True, "reason": "stop" | "length" | ..., "output_tokens": int,
    ...}``; ``reason`` is ``"stop"`` at an end-of-sequence id and ``"length"`` at ``max_tokens``.
    ``sampling`` holds ``max_tokens``, ``temperature``, ``top_p`` and ``seed`` (absent: the engine's
    defaults). Bad input raises :class:`~failsoft.errors.InvalidRequestError` before anything is
    sent to a worker; a service with no live worker raises
    :class:`~failsoft.errors.NoRouteError`. Closing the generator early cancels the request.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def context(self) -> int:
        """The model's context length in tokens (prompt + max_tokens must fit)."""
        ...

    def generate(
        self, tokens: Sequence[int], sampling: Mapping[str, Any], request_id: str
    ) -> AsyncIterator[dict[str, Any]]: ...
