"""Where an interrupted request goes when its worker fails (review, Mechanism 2, Eq. 6, Alg. 2).

When a worker fails, each of its in-flight requests is *interrupted*: its KV cache on the failed GPU
is gone. It can be restored on the peer holding its checkpoint (the checkpointed prefix is copied
from that peer's host memory to its GPU; only the tokens after the prefix are recomputed), or
recomputed from scratch (prompt plus the tokens generated so far, as a new prefill) on any worker.

Three dispatches (each a :class:`RecoveryDispatch`; ``route`` takes every interrupted request of one
failure event and a frozen :class:`~.load.ClusterView`, and returns one :class:`Route` each):

=========================  =======================================================================
:class:`LocalityAware`     LUMEN (Eq. 6): to the holder if L(holder) <= theta * (mean L of the up
                           workers) or the checkpoint is longer than tau pages; else to the least
                           loaded up worker, recomputing. Loads are updated as requests are routed
                           (Alg. 2): the holder gains alpha * |KV| + beta, a recompute target beta.
:class:`HolderFirst`       Fixed-Checkpointing (DejaVu): always the holder when it is up; else the
                           least loaded worker, recomputing
:class:`RecomputeAll`      Stop-and-Restart: the least loaded worker, recomputing
=========================  =======================================================================

``theta`` is *relative*: the review gives "2x normal queue depth" as its example, and a threshold
relative to the survivors' mean keeps one value meaningful at every scale and load. ``tau`` counts
KV pages of :data:`~.load.PAGE_TOKENS` tokens (the review's example, 512 tokens, is 32 pages).
A request whose holder is down (it failed too) is recomputed. With no up worker at all a route has
``worker`` None: the caller holds the request until a worker is up again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from failsoft.errors import ConfigError
from failsoft.policies.llm_recovery.load import ClusterView, pages, recovery_load
from failsoft.services import LlmParams


@dataclass(frozen=True, slots=True)
class Interrupted:
    """An interrupted request: its checkpoint ``holder`` (None: none) covering ``checkpoint_tokens``
    tokens (``kv_mb`` megabytes), and ``context_tokens`` (prompt plus generated) to recompute."""

    request: object
    context_tokens: int
    holder: str | None = None
    checkpoint_tokens: int = 0
    kv_mb: float = 0.0

    def __post_init__(self) -> None:
        for name in ("context_tokens", "checkpoint_tokens", "kv_mb"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"Interrupted.{name} must be >= 0; got {value!r}")
        if self.checkpoint_tokens > self.context_tokens:
            raise ConfigError(
                f"Interrupted.checkpoint_tokens ({self.checkpoint_tokens}) exceeds context_tokens "
                f"({self.context_tokens})"
            )


@dataclass(frozen=True, slots=True)
class Route:
    """Send ``request`` to ``worker`` (None: no worker is up; hold it); ``restore``: from its
    checkpoint on that worker (else recompute); ``reason`` says why."""

    request: object
    worker: str | None
    restore: bool
    reason: str


class RecoveryDispatch(ABC):
    """Routes the interrupted requests of one failure event."""

    name: ClassVar[str]

    def route(
        self, interrupted: Sequence[Interrupted], view: ClusterView, params: LlmParams
    ) -> tuple[Route, ...]:
        threshold = params.theta * view.mean_load(params)
        routes = []
        for item in interrupted:
            route = self._one(item, view, params, threshold)
            routes.append(route)
            if route.worker is not None:
                extra = item.kv_mb if route.restore else 0.0
                view = view.with_added(route.worker, queue=1, held_kv_mb=extra)
        return tuple(routes)

    @abstractmethod
    def _one(self, item: Interrupted, view: ClusterView, params: LlmParams, threshold: float) -> Route: ...

    @staticmethod
    def _recompute(item: Interrupted, view: ClusterView, params: LlmParams, why: str) -> Route:
        target = view.least_loaded(params)
        if target is None:
            return Route(item.request, None, False, "no worker is up")
        return Route(item.request, target.name, False, why)

    @staticmethod
    def _holder_up(item: Interrupted, view: ClusterView) -> bool:
        if item.holder is None or item.checkpoint_tokens == 0:
            return False
        return any(w.name == item.holder and w.up for w in view.workers)


class LocalityAware(RecoveryDispatch):
    """LUMEN (Eq. 6): the holder unless it is overloaded and the checkpointed prefix is short."""

    name = "locality-aware"

    def _one(self, item: Interrupted, view: ClusterView, params: LlmParams, threshold: float) -> Route:
        if not self._holder_up(item, view):
            return self._recompute(item, view, params, "no usable checkpoint")
        assert item.holder is not None
        load = recovery_load(view.get(item.holder), params)
        if load <= threshold:
            return Route(
                item.request, item.holder, True, f"holder load {load:.2f} <= theta bound {threshold:.2f}"
            )
        if pages(item.checkpoint_tokens) > params.tau:
            return Route(
                item.request, item.holder, True, f"prefix of {pages(item.checkpoint_tokens)} pages > tau"
            )
        return self._recompute(item, view, params, f"holder overloaded ({load:.2f}) and prefix short")


class HolderFirst(RecoveryDispatch):
    """Fixed-Checkpointing: always the holder when it is up."""

    name = "holder"

    def _one(self, item: Interrupted, view: ClusterView, params: LlmParams, threshold: float) -> Route:
        if self._holder_up(item, view):
            return Route(item.request, item.holder, True, "checkpoint holder")
        return self._recompute(item, view, params, "no usable checkpoint")


class RecomputeAll(RecoveryDispatch):
    """Stop-and-Restart: every interrupted request is recomputed on the least loaded worker."""

    name = "recompute"

    def _one(self, item: Interrupted, view: ClusterView, params: LlmParams, threshold: float) -> Route:
        return self._recompute(item, view, params, "recompute from scratch")
