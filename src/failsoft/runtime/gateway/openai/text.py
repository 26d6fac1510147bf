"""A generation's text as OpenAI returns it: decoded incrementally, cut before its first stop string.

OpenAI's ``stop`` ends the answer *before* the stop string (which is never returned) with
``finish_reason: "stop"``. Tokens and stop strings do not align (a stop string may span tokens, a
token may hold a stop string and more), so stops are found in the text: every new piece is added
to the text not yet sent, the earliest match of any stop string there ends the generation, and
otherwise all of it is sent except its longest tail that could still begin a stop string. What was
sent can never turn out to be part of a stop string, so the stream never takes anything back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from failsoft.llm.tokens import IncrementalDecoder, Tokenizer


@dataclass(frozen=True)
class Piece:
    """Text to send now; ``stopped`` when a stop string ended the generation."""

    text: str
    stopped: bool = False


class StopMatcher:
    """Text in, the part safe to send out; stops at the first stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""

    def feed(self, text: str) -> Piece:
        held = self._held + text
        ends = [i for i in (held.find(s) for s in self.stops) if i >= 0]
        if ends:
            self._held = ""
            return Piece(held[: min(ends)], stopped=True)
        keep = self._open_tail(held)
        self._held = held[len(held) - keep :] if keep else ""
        return Piece(held[: len(held) - keep])

    def flush(self) -> str:
        """What was held back at the end of the generation (it began no stop string after all)."""
        held, self._held = self._held, ""
        return held

    def _open_tail(self, text: str) -> int:
        """The length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


class TextStream:
    """Token ids in, OpenAI's text out: incremental decoding, then the stop strings."""

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int], stops: Sequence[str]) -> None:
        self._decoder = IncrementalDecoder(tokenizer, prompt)
        self._stops = StopMatcher(stops)

    def feed(self, tokens: Sequence[int]) -> Piece:
        return self._stops.feed(self._decoder.feed(tokens))

    def finish(self) -> Piece:
        """The rest, once the backend finished (a stop string may still be in it)."""
        last = self._stops.feed(self._decoder.flush())
        return last if last.stopped else Piece(last.text + self._stops.flush())
