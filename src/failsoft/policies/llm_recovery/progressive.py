"""What a restarted worker does while its full model reloads (review, Mechanism 3, Alg. 3, Eq. 3).

A restarted worker first loads a small *draft* model that shares the target's vocabulary (seconds),
then the full *target* model in the background (minutes). LUMEN does not leave it idle meanwhile:
it drafts ``k`` tokens (``draft_tokens``) for requests of the most loaded survivor, which verifies
them in one pass with its target model and keeps the accepted prefix plus one token of its own, so
its output is exactly the target's (greedy or sampled, as speculative decoding guarantees).

:meth:`ProgressiveRecovery.decide` returns one :class:`ProgressiveDecision` per recovering worker:

``loading``       nothing loaded yet: idle
``peer-verify``   draft up, target not: draft for the most loaded up survivor (Alg. 3 line 4),
                  which verifies; each survivor is assisted by at most one worker. The draft and
                  the verification run on different GPUs, so two micro-batches pipeline: a step
                  takes max(k * c, v) target decode steps (c: draft step / target step, v:
                  verification step / decode step), and yields E = (1 - a^(k+1)) / (1 - a) tokens
                  (Eq. 3, a the acceptance rate). Assisting only when E / max(k c, v) > 1.
``self-draft``    target back: keep the draft and speculate on its own requests only when
                  E / (k c + v) >= 1.2 (draft and verification now share one GPU and run in
                  turn; the draft's HBM is taken from the KV cache, so a marginal gain does not
                  pay for it);
``full``          target back, plain decoding (the draft is evicted): the usual case, since a draft
                  that is not far cheaper than the target gains nothing on the same GPU.

Why verification by a peer while the target reloads, and self-drafting only after: before the
target is back, the worker cannot verify anything itself, and the survivors are the bottleneck, so
its draft capacity is worth most to the most loaded one; after, the worker is a full replica and
speculating on its own GPU pays only if drafting is cheap relative to the target (the decision is
computed, with the reason, from the same formula).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from failsoft.errors import ConfigError
from failsoft.policies.llm_recovery.load import ClusterView, recovery_load
from failsoft.services import LlmParams

SELF_DRAFT_MIN_GAIN = 1.2  # a draft kept beside the target takes HBM from the KV cache: it must pay


def expected_tokens(acceptance: float, draft_tokens: int) -> float:
    """Tokens per speculative step (Eq. 3): accepted drafts plus the target's own token."""
    if not 0 <= acceptance <= 1:
        raise ConfigError(f"acceptance must be in [0, 1]; got {acceptance!r}")
    if draft_tokens < 1:
        raise ConfigError(f"draft_tokens must be >= 1; got {draft_tokens!r}")
    if acceptance == 1:
        return float(draft_tokens + 1)
    return (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)


@dataclass(frozen=True, slots=True)
class SpeculationCost:
    """``acceptance``: draft tokens the target accepts; ``draft_step``: a draft decode step over a
    target decode step (same batch); ``verify_step``: verifying k+1 tokens over a decode step."""

    acceptance: float = 0.6
    draft_step: float = 0.386
    verify_step: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance <= 1:
            raise ConfigError(f"SpeculationCost.acceptance must be in [0, 1]; got {self.acceptance!r}")
        if not self.draft_step >= 0:
            raise ConfigError(f"SpeculationCost.draft_step must be >= 0; got {self.draft_step!r}")
        if not self.verify_step >= 1:
            raise ConfigError(f"SpeculationCost.verify_step must be >= 1; got {self.verify_step!r}")

    def peer_speedup(self, draft_tokens: int) -> float:
        """Decode speed-up of a survivor assisted by a drafting peer (pipelined on two GPUs)."""
        return expected_tokens(self.acceptance, draft_tokens) / max(
            draft_tokens * self.draft_step, self.verify_step
        )

    def self_speedup(self, draft_tokens: int) -> float:
        """Decode speed-up of a worker drafting for itself (draft and verification in turn)."""
        return expected_tokens(self.acceptance, draft_tokens) / (
            draft_tokens * self.draft_step + self.verify_step
        )


@dataclass(frozen=True, slots=True)
class Recovering:
    """A restarted worker: whether its draft and its target model are loaded."""

    name: str
    draft_ready: bool = False
    target_ready: bool = False


@dataclass(frozen=True, slots=True)
class ProgressiveDecision:
    worker: str
    mode: str  # loading | peer-verify | self-draft | full | idle
    assist: str | None
    speedup: float
    reason: str


class ProgressiveRecovery:
    """Alg. 3's decisions; stateless: call it whenever a recovering worker's state or loads change."""

    def decide(
        self, recovering: Sequence[Recovering], view: ClusterView, params: LlmParams, cost: SpeculationCost
    ) -> tuple[ProgressiveDecision, ...]:
        k = params.draft_tokens
        taken: set[str] = set()
        out = []
        for worker in recovering:
            if worker.target_ready:
                gain = cost.self_speedup(k)
                if gain >= SELF_DRAFT_MIN_GAIN:
                    out.append(
                        ProgressiveDecision(
                            worker.name, "self-draft", None, gain, "drafting on its own GPU pays"
                        )
                    )
                else:
                    out.append(
                        ProgressiveDecision(
                            worker.name,
                            "full",
                            None,
                            1.0,
                            f"self-drafting gains {gain:.2f}x < {SELF_DRAFT_MIN_GAIN}x",
                        )
                    )
                continue
            if not worker.draft_ready:
                out.append(ProgressiveDecision(worker.name, "loading", None, 1.0, "draft model loading"))
                continue
            gain = cost.peer_speedup(k)
            survivors = [w for w in view.up() if w.name not in taken]
            if gain <= 1:
                out.append(
                    ProgressiveDecision(
                        worker.name, "idle", None, 1.0, f"peer drafting gains {gain:.2f}x <= 1"
                    )
                )
            elif not survivors:
                out.append(ProgressiveDecision(worker.name, "idle", None, 1.0, "no survivor to assist"))
            else:
                target = max(survivors, key=lambda w: (recovery_load(w, params), w.queue))
                taken.add(target.name)
                out.append(
                    ProgressiveDecision(worker.name, "peer-verify", target.name, gain, "most loaded survivor")
                )
        return tuple(out)
