"""OpenAI-compatible endpoints (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
streamed by server-sent events as OpenAI streams) over the ``llm`` services.

:func:`openai_router` is a FastAPI router the gateway includes; each served model is an
:class:`~failsoft.runtime.gateway.llm_backend.LlmBackend`. The modules: :mod:`.schema` (the
request bodies and what is served of them), :mod:`.routes` (the endpoints), :mod:`.generation`
(one request through a backend), :mod:`.text` (incremental text and stop strings), :mod:`.shapes`
(OpenAI's answers and chunks), :mod:`.errors` (OpenAI's error object).
"""

from failsoft.runtime.gateway.openai.routes import openai_router

__all__ = ["openai_router"]
