"""Where a request's KV checkpoint goes (review, Mechanism 1, Alg. 1 and Eq. 5) and its ledger.

While a worker serves a request it streams the request's KV pages, incrementally, to the host
memory of one peer, the request's *checkpoint holder*. If the worker fails, the holder can restore
the request from those pages instead of recomputing its prompt and every token generated so far.

Three placements (each a :class:`CheckpointPlacement`, called once per request when its prefill
starts, with a frozen :class:`~.load.ClusterView`):

======================  ==========================================================================
:class:`LoadAware`      LUMEN (Alg. 1): the up peer with the lowest expected recovery load
                        L = alpha * held KV (GB) + beta * queue, among those whose budget still
                        fits the request's KV (Eq. 5); none fits: no checkpoint (the review's
                        fallback, recompute on failure)
:class:`RingNeighbour`  Fixed-Checkpointing (DejaVu's ring): the next up worker in ring order;
                        no fallback when its budget is full (no checkpoint)
:class:`NoCheckpoint`   Stop-and-Restart: never
======================  ==========================================================================

A checkpoint budget of 0 MB means no checkpoint at all, under every placement.

:class:`CheckpointLedger` is the bookkeeping both the runtime and the simulator keep: which peer
holds which request's checkpoint and how many tokens it covers, how much each peer holds. It
grows a checkpoint as tokens are generated (:meth:`~CheckpointLedger.extend`: a checkpoint that
would pass its holder's budget stops growing and keeps the prefix it has) and frees it when the
request finishes (:meth:`~CheckpointLedger.release`), so a peer's held KV always equals the sum of
its live checkpoints (tests count it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from failsoft.errors import ConfigError
from failsoft.policies.llm_recovery.load import ClusterView, recovery_load
from failsoft.services import LlmParams


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """``holder``: the peer to stream the request's KV to, or None (no checkpoint); ``reason``."""

    holder: str | None
    reason: str


class CheckpointPlacement(ABC):
    """Chooses a request's checkpoint holder when its prefill starts on ``serving``."""

    name: ClassVar[str]

    @abstractmethod
    def choose(self, serving: str, kv_mb: float, view: ClusterView, params: LlmParams) -> PlacementDecision:
        """The holder for a request whose KV is ``kv_mb`` now (its prompt) on worker ``serving``."""


def _check_kv(kv_mb: float) -> None:
    if not kv_mb >= 0:
        raise ConfigError(f"checkpoint kv_mb must be >= 0; got {kv_mb!r}")


def _fits(held_mb: float, kv_mb: float, params: LlmParams) -> bool:
    return params.checkpoint_budget_mb > 0 and held_mb + kv_mb <= params.checkpoint_budget_mb


class LoadAware(CheckpointPlacement):
    """LUMEN's placement (Alg. 1): argmin L over the up peers whose budget fits the KV (Eq. 5)."""

    name = "load-aware"

    def choose(self, serving: str, kv_mb: float, view: ClusterView, params: LlmParams) -> PlacementDecision:
        _check_kv(kv_mb)
        if params.checkpoint_budget_mb <= 0:
            return PlacementDecision(None, "checkpoint budget is 0")
        peers = [w for w in view.up() if w.name != serving and _fits(w.held_kv_mb, kv_mb, params)]
        if not peers:
            return PlacementDecision(None, "no up peer has budget left")
        best = min(peers, key=lambda w: (recovery_load(w, params), w.held_kv_mb))
        return PlacementDecision(
            best.name, f"lowest expected recovery load {recovery_load(best, params):.2f}"
        )


class RingNeighbour(CheckpointPlacement):
    """Fixed-Checkpointing: the next up worker after ``serving`` in the view's order (DejaVu)."""

    name = "ring"

    def choose(self, serving: str, kv_mb: float, view: ClusterView, params: LlmParams) -> PlacementDecision:
        _check_kv(kv_mb)
        if params.checkpoint_budget_mb <= 0:
            return PlacementDecision(None, "checkpoint budget is 0")
        names = [w.name for w in view.workers]
        if serving not in names:
            raise ConfigError(f"unknown serving worker {serving!r}")
        start = names.index(serving)
        for step in range(1, len(names)):
            peer = view.workers[(start + step) % len(names)]
            if peer.up:
                if _fits(peer.held_kv_mb, kv_mb, params):
                    return PlacementDecision(peer.name, "ring neighbour")
                return PlacementDecision(None, f"ring neighbour {peer.name} has no budget left")
        return PlacementDecision(None, "no up peer")


class NoCheckpoint(CheckpointPlacement):
    """Stop-and-Restart: requests are never checkpointed."""

    name = "none"

    def choose(self, serving: str, kv_mb: float, view: ClusterView, params: LlmParams) -> PlacementDecision:
        _check_kv(kv_mb)
        return PlacementDecision(None, "no checkpointing")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A live checkpoint: ``holder`` keeps the first ``tokens`` tokens of a request served on
    ``serving``, ``kv_mb`` megabytes."""

    serving: str
    holder: str
    tokens: int
    kv_mb: float


class _Live:
    __slots__ = ("holder", "kv_mb", "serving", "tokens")

    def __init__(self, serving: str, holder: str, tokens: int, kv_mb: float) -> None:
        self.serving, self.holder, self.tokens, self.kv_mb = serving, holder, tokens, kv_mb

    def frozen(self) -> Checkpoint:
        return Checkpoint(self.serving, self.holder, self.tokens, self.kv_mb)


class CheckpointLedger:
    """Which peer holds which request's KV checkpoint, within each peer's budget (Eq. 5).

    Pure bookkeeping (no clock, no I/O); keys are the caller's request ids. ``kv_mb_per_token`` is
    the model's KV size per token (:func:`~.load.kv_mb_per_token`).
    """

    def __init__(self, kv_mb_per_token: float, budget_mb: float) -> None:
        if not kv_mb_per_token > 0:
            raise ConfigError(f"kv_mb_per_token must be > 0; got {kv_mb_per_token!r}")
        if not budget_mb >= 0:
            raise ConfigError(f"checkpoint budget_mb must be >= 0; got {budget_mb!r}")
        self.kv_mb_per_token = kv_mb_per_token
        self.budget_mb = budget_mb
        self._entries: dict[object, _Live] = {}
        self._held: dict[str, float] = {}

    def assign(self, request: object, serving: str, holder: str, tokens: int) -> Checkpoint | None:
        """Start ``request``'s checkpoint on ``holder`` with its first ``tokens`` tokens; None when
        they do not fit the holder's budget (then nothing is recorded)."""
        if request in self._entries:
            raise ConfigError(f"request {request!r} already has a checkpoint")
        if holder == serving:
            raise ConfigError(f"request {request!r}: a worker cannot hold its own checkpoint ({holder!r})")
        if tokens < 0:
            raise ConfigError(f"checkpoint tokens must be >= 0; got {tokens!r}")
        kv_mb = tokens * self.kv_mb_per_token
        if self.held_mb(holder) + kv_mb > self.budget_mb or self.budget_mb <= 0:
            return None
        entry = _Live(serving, holder, tokens, kv_mb)
        self._entries[request] = entry
        self._held[holder] = self.held_mb(holder) + kv_mb
        return entry.frozen()

    def extend(self, request: object, tokens: int) -> int:
        """Grow ``request``'s checkpoint to ``tokens`` tokens, or as far as the holder's budget
        allows; return the tokens it covers (0 without a checkpoint)."""
        entry = self._entries.get(request)
        if entry is None:
            return 0
        if tokens <= entry.tokens:
            return entry.tokens
        held = self._held[entry.holder]
        grow = min(tokens - entry.tokens, int((self.budget_mb - held) // self.kv_mb_per_token))
        if grow <= 0:
            return entry.tokens
        added = grow * self.kv_mb_per_token
        entry.tokens += grow
        entry.kv_mb += added
        self._held[entry.holder] = held + added
        return entry.tokens

    def release(self, request: object) -> Checkpoint | None:
        """Free ``request``'s checkpoint (it finished, was restored, or was abandoned)."""
        entry = self._entries.pop(request, None)
        if entry is not None:
            left = self._held[entry.holder] - entry.kv_mb
            if left <= 1e-9 and not any(e.holder == entry.holder for e in self._entries.values()):
                del self._held[entry.holder]
            else:
                self._held[entry.holder] = max(0.0, left)
        return entry.frozen() if entry is not None else None

    def lose_holder(self, worker: str) -> list[object]:
        """``worker`` failed: the checkpoints it held are gone; return their requests."""
        lost = [r for r, e in self._entries.items() if e.holder == worker]
        for request in lost:
            self.release(request)
        return lost

    def get(self, request: object) -> Checkpoint | None:
        entry = self._entries.get(request)
        return entry.frozen() if entry is not None else None

    def __contains__(self, request: object) -> bool:
        return request in self._entries

    def held_mb(self, worker: str) -> float:
        return self._held.get(worker, 0.0)

    def total_mb(self) -> float:
        return sum(self._held.values())

    def __len__(self) -> int:
        return len(self._entries)
