"""OpenAI's request bodies for ``/v1/completions`` and ``/v1/chat/completions``, as pydantic models.

Fields follow OpenAI's API reference. What this server does with each:

* served: ``model``, ``prompt`` (a string, a list of token ids, or a list holding one of them) /
  ``messages`` (text content: a string or ``text`` parts), ``max_tokens`` (and
  ``max_completion_tokens`` for a chat, which wins), ``temperature`` [0, 2], ``top_p`` (0, 1],
  ``seed``, ``stop`` (a string or up to 4), ``n`` (1 only), ``stream``, ``stream_options``
  (``include_usage``);
* accepted and ignored, as they change nothing in the answer: ``user``, ``metadata``, ``store``,
  ``service_tier``;
* accepted only at their neutral value (anything else is refused naming the field, rather than
  silently not done): ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``logprobs``,
  ``top_logprobs``, ``echo``, ``best_of``, ``suffix``, ``tools``, ``tool_choice``,
  ``parallel_tool_calls``, ``functions``, ``function_call``, ``response_format``;
* any other field is refused as OpenAI refuses it ("Unrecognized request argument supplied").
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_STOPS = 4
NEUTRAL: dict[str, tuple[Any, ...]] = {  # field: the values that ask for nothing
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """What both endpoints share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int:
        if n not in (None, 1):
            raise ValueError(f"n must be 1: this server returns one choice per request; got {n}")
        return 1

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences; got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _streaming(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    @field_validator("*")
    @classmethod
    def _neutral(cls, value: Any, info: ValidationInfo) -> Any:
        """A field this server does not serve, given (defaults are not validated): only its
        neutral value."""
        neutral = NEUTRAL.get(info.field_name or "")
        if neutral is not None and value not in neutral:
            raise ValueError(f"{info.field_name} is not supported by this server (only {neutral[1]!r})")
        return value

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``; ``max_tokens`` defaults to 16, as OpenAI's."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError(f"one prompt per request: this server batches none; got {len(prompt)}")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @property
    def one_prompt(self) -> str | list[int]:
        """The prompt: text or token ids (the validator unwrapped a list of one)."""
        return cast("str | list[int]", self.prompt)


class ChatMessage(BaseModel):
    """One message; fields a client echoes back from an earlier answer (``refusal``, ...) are
    ignored; content is text (a string, or ``text`` parts joined)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[dict[str, Any]] | None) -> str:
        if not isinstance(content, list):
            return content or ""
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are served; got {part.get('type')!r}")
        return "".join(part["text"] for part in content)

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else ""


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``; without a limit the answer may fill the context."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
