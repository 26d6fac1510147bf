"""What every LUMEN decision reads: a frozen snapshot of the cluster's load (review, Eq. 4).

A runtime controller and the simulator both describe their cluster with a :class:`ClusterView` (one
:class:`WorkerLoad` per worker: in-flight requests, KV checkpoints held for peers, whether it is up
and whether it serves with its full model) and pass it, with :class:`~failsoft.services.LlmParams`,
to the placement, dispatch and progressive-recovery policies, which return frozen decisions. Nothing
here reads a clock or mutates a view: :meth:`ClusterView.with_added` returns a new one.

The expected recovery load of a worker (Eq. 4) is

    L(w) = alpha * (KV checkpoints held on w, in GB) + beta * (requests in flight on w)

so ``alpha`` is per GB of held KV and ``beta`` per request. KV sizes follow Eq. 1: a token of a
model with ``n_layers`` layers and ``n_kv_heads`` heads of ``d_head`` dimensions costs
``2 * n_layers * n_kv_heads * d_head * bytes`` (:func:`kv_mb_per_token`); the review counts
checkpoints in KV pages, and failsoft's pages are :data:`PAGE_TOKENS` tokens (vLLM's default block).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from failsoft.errors import ConfigError
from failsoft.services import LlmParams

PAGE_TOKENS = 16  # tokens per KV page (vLLM's default block size); tau counts these pages
MB_PER_GB = 1024.0


def kv_mb_per_token(n_layers: int, n_kv_heads: int, d_head: int, dtype_bytes: int = 2) -> float:
    """KV-cache megabytes per token (review Eq. 1): keys and values of every layer and KV head."""
    for name, value in (
        ("n_layers", n_layers),
        ("n_kv_heads", n_kv_heads),
        ("d_head", d_head),
        ("dtype_bytes", dtype_bytes),
    ):
        if value < 1:
            raise ConfigError(f"kv_mb_per_token: {name} must be >= 1; got {value!r}")
    return 2 * n_layers * n_kv_heads * d_head * dtype_bytes / (1024 * 1024)


def pages(tokens: int) -> int:
    """KV pages holding ``tokens`` tokens."""
    return math.ceil(tokens / PAGE_TOKENS)


def _non_negative(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value >= 0:  # also refuses NaN
            raise ConfigError(f"{owner}.{name} must be >= 0; got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker as the policies see it.

    ``queue`` counts its requests in flight (running and waiting); ``held_kv_mb`` the KV checkpoints
    it holds in host memory for its peers; ``alive`` is false from its failure until it restarts;
    ``serving`` is true while it serves with its full model (false while it reloads, even when a
    draft model is up).
    """

    name: str
    queue: int = 0
    held_kv_mb: float = 0.0
    alive: bool = True
    serving: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("WorkerLoad.name must not be empty")
        _non_negative("WorkerLoad", queue=self.queue, held_kv_mb=self.held_kv_mb)

    @property
    def up(self) -> bool:
        """Alive and serving with the full model: it can run requests and hold checkpoints."""
        return self.alive and self.serving


def recovery_load(worker: WorkerLoad, params: LlmParams) -> float:
    """Expected recovery load L(w) (Eq. 4): alpha per GB of held KV plus beta per request."""
    return params.alpha * worker.held_kv_mb / MB_PER_GB + params.beta * worker.queue


@dataclass(frozen=True, slots=True)
class ClusterView:
    """A frozen snapshot of the cluster, in the caller's worker order (the ring order of the
    fixed-checkpointing baseline)."""

    workers: tuple[WorkerLoad, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(self.workers))
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            raise ConfigError(f"ClusterView: worker names repeat in {names!r}")

    @classmethod
    def of(cls, workers: Iterable[WorkerLoad]) -> ClusterView:
        return cls(tuple(workers))

    def get(self, name: str) -> WorkerLoad:
        for worker in self.workers:
            if worker.name == name:
                return worker
        raise ConfigError(f"unknown worker {name!r} (known: {', '.join(w.name for w in self.workers)})")

    def up(self) -> tuple[WorkerLoad, ...]:
        return tuple(w for w in self.workers if w.up)

    def least_loaded(self, params: LlmParams, exclude: Iterable[str] = ()) -> WorkerLoad | None:
        """The up worker with the lowest L (ties: fewer requests, then caller's order), or None."""
        skip = set(exclude)
        candidates = [w for w in self.up() if w.name not in skip]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (recovery_load(w, params), w.queue))

    def mean_load(self, params: LlmParams) -> float:
        """Mean L over the up workers (0 with none)."""
        up = self.up()
        return sum(recovery_load(w, params) for w in up) / len(up) if up else 0.0

    def with_added(self, name: str, *, queue: int = 0, held_kv_mb: float = 0.0) -> ClusterView:
        """A new view in which ``name`` has ``queue`` more requests and ``held_kv_mb`` more KV."""
        return ClusterView(
            tuple(
                replace(w, queue=w.queue + queue, held_kv_mb=max(0.0, w.held_kv_mb + held_kv_mb))
                if w.name == name
                else w
                for w in self.workers
            )
        )
