"""Tokenizers the engine serves with: the byte tokens of the pair trained here, or a Hugging Face
model's own tokenizer and chat template.

The engine only needs four things from a tokenizer: text to token ids (a completion's prompt),
chat messages to token ids (a chat's prompt, through the model's chat template), token ids back to
text, and which ids end a generation. :class:`ByteTokenizer` (tokens are UTF-8 bytes, no download)
and :class:`HfTokenizer` (``AutoTokenizer`` of a local model directory) both give them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from failsoft.errors import InvalidRequestError
from failsoft.llm.corpus import EOS, decode, encode

Message = Mapping[str, str]


class Tokenizer(Protocol):
    """What the engine and a gateway ask of a tokenizer."""

    name: str

    def encode(self, text: str | bytes) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[Message]) -> list[int]: ...


def _check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise InvalidRequestError("a chat needs at least one message")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise InvalidRequestError(f"message {i} must have a string 'role' and 'content'; got {m!r}")


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0-255; EOS 257). It has no chat template of its own, so a chat is
    rendered as ``role: content`` lines followed by ``assistant: ``, the plain-text convention the
    byte-level pair can continue."""

    name = "bytes"
    eos_ids = frozenset({EOS})

    def encode(self, text: str | bytes) -> list[int]:
        return encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return decode(list(tokens))

    def chat(self, messages: Sequence[Message]) -> list[int]:
        _check_messages(messages)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return encode(text + "assistant: ")


BYTES = ByteTokenizer()


class HfTokenizer:
    """A ``transformers`` tokenizer: ``encode`` adds the model's special tokens as the model
    expects (BOS for Llama), ``decode`` drops them, ``chat`` applies the model's chat template with
    the generation prompt."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self.tok = tokenizer
        self.name = name

    def encode(self, text: str | bytes) -> list[int]:
        s = text.decode() if isinstance(text, bytes) else text
        return [int(t) for t in self.tok.encode(s)]

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self.tok.decode(list(tokens), skip_special_tokens=True))

    def chat(self, messages: Sequence[Message]) -> list[int]:
        _check_messages(messages)
        if not getattr(self.tok, "chat_template", None):
            raise InvalidRequestError(f"model {self.name!r} has no chat template; send a completion instead")
        ids = self.tok.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(t) for t in ids]


def same_tokens(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether two tokenizers map text to the same ids (a draft must share its target's): the same
    vocabulary for two Hugging Face tokenizers, both byte-level otherwise."""
    if isinstance(a, HfTokenizer) and isinstance(b, HfTokenizer):
        return bool(a.tok.get_vocab() == b.tok.get_vocab())
    return type(a) is type(b)


def eos_ids(module: Any, tokenizer: Any | None = None) -> frozenset[int]:
    """The ids that end a generation, as ``transformers``' ``generate`` reads them: the model's
    generation config, else its config, else the tokenizer's EOS."""
    for source in (getattr(module, "generation_config", None), module.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            return frozenset(int(v) for v in (value if isinstance(value, list | tuple) else [value]))
    return frozenset()


class IncrementalDecoder:
    """Token ids to text as they come, so that the pieces concatenate to the text of the whole.

    Decoding each token alone is wrong twice: a character split over several byte-level tokens
    decodes to U+FFFD halves, and tokenizers that mark word starts (SentencePiece's ``▁``) drop
    the space of a piece decoded without its left context. vLLM's answer, kept here: decode a
    short window (the tokens already shown since the previous piece, then the new ones) and emit
    only what the new tokens add to the window's text, and only once it does not end in U+FFFD
    (a character still incomplete waits for its next bytes). The window starts on the prompt's
    last few tokens, so the first piece has its context too.
    """

    CONTEXT = 5

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int] = ()) -> None:
        self._decode = tokenizer.decode
        self._ids = [int(t) for t in prompt[-self.CONTEXT :]]
        self._read = len(self._ids)  # the window: ids[:read] is shown already, ids[read:] is not

    def feed(self, tokens: Sequence[int]) -> str:
        """The text ``tokens`` add (empty while a character is incomplete)."""
        self._ids.extend(int(t) for t in tokens)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back at the end (an incomplete character, as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        shown = self._decode(self._ids[: self._read])
        text = self._decode(self._ids)
        if len(text) <= len(shown) or (text.endswith("\ufffd") and not final):
            return ""
        del self._ids[: self._read]  # the next window: what this piece shows, then what comes
        self._read = len(self._ids)
        return text[len(shown) :]
