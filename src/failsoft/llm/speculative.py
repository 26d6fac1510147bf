"""Speculative decoding from the engine's separate calls: draft on one engine, verify on another.

:func:`speculative_generate` runs a request on a target engine with a draft engine proposing
``draft_tokens`` tokens per step; the two engines may be on one machine (self-drafting) or, with
the same three calls carried over a network, on two workers (LUMEN's Alg. 3: the restarted worker
drafts, a peer holding the target verifies). Greedy only: the output then equals the target's own,
token for token. A draft is any model with the target's tokenizer (a smaller one of its family);
one with another tokenizer is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from failsoft.errors import InvalidRequestError
from failsoft.llm.engine import Engine, SamplingParams
from failsoft.llm.tokens import same_tokens


@dataclass(frozen=True)
class SpeculativeResult:
    tokens: tuple[int, ...]
    steps: int
    proposed: int
    accepted: int

    @property
    def acceptance(self) -> float:
        """Accepted over proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


def speculative_generate(
    target: Engine,
    draft: Engine,
    prompt: str | bytes | Sequence[int],
    params: SamplingParams,
    draft_tokens: int = 3,
) -> SpeculativeResult:
    """Generate with ``draft`` proposing and ``target`` verifying; both requests are closed after."""
    if draft_tokens < 1:
        raise InvalidRequestError(f"draft_tokens must be >= 1; got {draft_tokens!r}")
    if not same_tokens(target.tokenizer, draft.tokenizer):
        raise InvalidRequestError(
            f"the draft {draft.lm.name!r} does not share the tokenizer of the target {target.lm.name!r}"
        )
    t = target.open(prompt, params)
    try:
        d = draft.open(prompt, params)
    except Exception:
        target.close(t.id)
        raise
    steps = proposed = accepted = 0
    try:
        while not t.finished:
            drafts = draft.propose(d.id, draft_tokens)
            verdict = target.verify(t.id, drafts)
            draft.accept(d.id, verdict.tokens)
            steps += 1
            proposed += verdict.proposed
            accepted += verdict.accepted
        return SpeculativeResult(tuple(t.output), steps, proposed, accepted)
    finally:
        target.close(t.id)
        draft.close(d.id)
