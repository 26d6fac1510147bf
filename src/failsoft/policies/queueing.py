"""Serving-queue disciplines: which queued requests run next as one batch, which are dropped, and
which new requests a bounded queue refuses (issue "one serving core": a queue per loaded model).

Every loaded model has one queue and one worker that runs one batch at a time. Whenever the worker
is free it asks the discipline :meth:`QueueDiscipline.next_batch`: given the queued requests (each
with its arrival time, deadline and number of rows), the time now and the model's batch service
time, it returns the batch to run and the requests to drop. Before a request is queued, the
discipline's :meth:`QueueDiscipline.admit` estimates when it would finish (the work ahead of it,
packed into batches, from the same service time) and refuses it, with a ``retry_after_s`` estimate,
when it cannot finish before its deadline or the queue is at its hard bound: a client gets a fast
"try later" instead of a wait that ends in a timeout.

Three disciplines (registered in :mod:`failsoft.policies.registry` under the ``queueing`` seam):

==================  ======================  ==================================================
name                service order           dropped (never run)
==================  ======================  ==================================================
``fifo``            arrival                 requests already past their deadline
``batch-lazy-drop`` arrival                 requests that cannot finish in time even alone,
                                            when they come up (Clockwork, Jellyfish 4.3)
``edf``             earliest deadline       as ``batch-lazy-drop``
==================  ======================  ==================================================

A batch holds at most ``max_batch`` *rows* (one row per request for single-input clients, so
``max_batch`` requests); a request with more rows than that runs alone. ``fifo`` fills a batch in
arrival order. The two lazy disciplines (Clockwork's and Jellyfish's fixed-size batching with lazy
dropping) also stop growing a batch before it would make any of its members miss its deadline: the
request that does not fit waits for the next batch rather than spoiling this one.

Service time comes from measured profiles: :class:`ServiceModel` is the variant's batch latency
(:meth:`~failsoft.domain.Variant.latency_at`, the zoo's per-batch profile, or the ``batch_cost``
formula without one), times a ``scale`` the runtime learns from the batches it runs, plus a fixed
``overhead_ms`` per batch (an injected slowdown). Everything here is pure: time is passed in, nothing
sleeps, locks or starts a thread; the runtime's agents and the simulator call the same objects.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Le

from failsoft.bounds import STRICT, check_bounds
from failsoft.domain import Variant

MIN_RETRY_S = 0.001  # a refusal never says "retry now": the queue was just measured full
# Admission keeps this share of a request's predicted time in the queue as slack for the estimate's
# error: under a crowd that asks again at once, every request is admitted at the edge, so any batch
# that runs longer than estimated made the requests behind it late (measured: 504s on a busy host).
WAIT_MARGIN = 0.1
# A request that joins a greedy (fifo) batch is costed in that batch grown to the largest size that
# takes at most this share of its time to the deadline (the rest is its wait): later requests fill it.
RESERVE_SHARE = 0.5
# An idle queue that has run nothing for this long admits a request its estimate refuses: the
# estimate is learned from the batches it runs, so one that grew past every deadline (a host that
# was briefly much slower) could otherwise never come down, and the queue refused everything for good.
PROBE_S = 1.0
MAX_BATCH = 64  # rows; the zoo profiles batches up to 16, larger ones are extrapolated
WARMUP_ROUNDS = 2  # after the first answer: (max batch, batch 1), this many times
WARMUP_MIN_BUDGET_MS = 200.0  # warm-up may always take this long (profiled) ...
WARMUP_LOAD_SHARE = 0.5  # ... or this share of the variant's profiled load time, if more


@dataclass(frozen=True, slots=True)
class QueueParams:
    """A serving queue's settings (config ``agents.queue``); bounds are checked where it is built."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    discipline: str = "fifo"
    max_batch: Annotated[int, Ge(1), Le(MAX_BATCH)] = 8
    max_queue: Annotated[int, Ge(1), Le(65_536)] = 256

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True, slots=True)
class Queued:
    """A queued request as the discipline sees it; ``key`` is the caller's handle on it."""

    key: Any = field(compare=False)
    arrival_s: float
    deadline_s: float  # math.inf: no deadline
    rows: int = 1


@dataclass(frozen=True, slots=True)
class Batch:
    """What the worker does next: run ``run`` as one batch, answer ``drop`` as missed."""

    run: tuple[Queued, ...] = ()
    drop: tuple[Queued, ...] = ()

    @property
    def rows(self) -> int:
        return sum(q.rows for q in self.run)


@dataclass(frozen=True, slots=True)
class Admission:
    """A queue's answer to a new request: ``finish_s`` is the estimate it was judged by."""

    admitted: bool
    finish_s: float
    retry_after_s: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Seconds a batch of ``rows`` takes on one loaded model: a measured profile, calibrated.

    ``scale`` corrects the profile for this machine as it is now (1.0: as profiled); ``overhead_ms``
    is added to every batch (an injected slowdown).
    """

    variant: Variant
    batch_cost: float = 1.0
    scale: float = 1.0
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (self.scale > 0 and self.overhead_ms >= 0 and 0 < self.batch_cost <= 1):
            raise ValueError(
                f"service model of {self.variant.name!r}: scale must be > 0, overhead_ms >= 0 and "
                f"batch_cost in (0, 1]; got {self.scale!r}, {self.overhead_ms!r}, {self.batch_cost!r}"
            )

    def profile_ms(self, rows: int) -> float:
        """The profile's milliseconds for ``rows``, uncalibrated."""
        return self.variant.latency_at(rows, self.batch_cost)

    def batch_s(self, rows: int) -> float:
        return (self.overhead_ms + self.scale * self.profile_ms(rows)) / 1000.0


class QueueDiscipline(ABC):
    """A serving queue's policy: the next batch, lazy drops, admission. Pure and stateless.

    ``name`` is the one the registry lists it under. Callers pass the queue in arrival order; the
    discipline never mutates it.
    """

    name: ClassVar[str]
    lazy_drop: ClassVar[bool]  # drop a request that cannot finish in time even alone, at dequeue

    def __init__(
        self, max_batch: int = 8, max_queue: int | None = 256, wait_margin: float = WAIT_MARGIN
    ) -> None:
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"{self.name}: max_batch must be in 1..{MAX_BATCH}; got {max_batch!r}")
        if max_queue is not None and max_queue < 1:
            raise ValueError(f"{self.name}: max_queue must be at least 1 (or None); got {max_queue!r}")
        if not 0 <= wait_margin < 1:
            raise ValueError(f"{self.name}: wait_margin must be in [0, 1); got {wait_margin!r}")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.wait_margin = wait_margin

    @classmethod
    def from_params(cls, params: QueueParams) -> QueueDiscipline:
        return cls(params.max_batch, params.max_queue)

    @abstractmethod
    def order(self, queue: Sequence[Queued]) -> Sequence[Queued]:
        """The queue in service order."""

    def ahead(self, queue: Sequence[Queued], item: Queued) -> list[Queued]:
        """The queued requests that would be served before ``item``."""
        return list(queue)

    # the worker's decision ---------------------------------------------------------------------
    def next_batch(self, queue: Sequence[Queued], now_s: float, service: ServiceModel) -> Batch:
        """The batch to run now and the requests to drop (both possibly empty only if ``queue`` is).

        Requests are taken in service order: a hopeless one (see :meth:`hopeless`) is dropped; the
        others join the batch until it is full (``max_batch`` rows; the first always joins) or, for
        the lazy disciplines, until one more would make a member miss its deadline.
        """
        run: list[Queued] = []
        drop: list[Queued] = []
        rows, deadline = 0, math.inf
        for item in self.order(queue):
            if self.hopeless(item, now_s, service):
                drop.append(item)
                continue
            if run and not self._fits(rows, deadline, item, now_s, service):
                break
            run.append(item)
            rows, deadline = rows + item.rows, min(deadline, item.deadline_s)
        return Batch(tuple(run), tuple(drop))

    def hopeless(self, item: Queued, now_s: float, service: ServiceModel) -> bool:
        """True when nobody can use ``item``'s answer any more (lazy: it cannot even finish in time)."""
        if self.lazy_drop:
            return now_s + service.batch_s(item.rows) > item.deadline_s
        return now_s >= item.deadline_s

    def _fits(self, rows: int, deadline: float, item: Queued, now_s: float, service: ServiceModel) -> bool:
        if rows + item.rows > self.max_batch:
            return False
        if not self.lazy_drop:
            return True
        return now_s + service.batch_s(rows + item.rows) <= min(deadline, item.deadline_s)

    # admission -----------------------------------------------------------------------------------
    def admit(
        self,
        queue: Sequence[Queued],
        item: Queued,
        now_s: float,
        free_at_s: float,
        service: ServiceModel,
        *,
        running: bool | None = None,
        idle_s: float = 0.0,
    ) -> Admission:
        """Take ``item`` only if it can finish before its deadline and the queue has room.

        ``free_at_s`` is when the batch running now is expected to end (``now_s`` or earlier when
        idle); ``running`` says whether one runs (default: ``free_at_s > now_s``; a batch that
        overran its estimate runs still); ``idle_s``: how long the queue has been idle, nothing
        running or queued (past :data:`PROBE_S`, a request is admitted whatever the estimate says,
        to check it). The estimate packs the work ahead of ``item`` into full
        batches, which is what a busy queue runs; ``retry_after_s`` is when that work ahead will
        have drained.

        When ``item`` will not start at once (a batch runs, or requests are queued), a discipline
        that batches greedily (``fifo``) lets requests that come after it join its batch, which then
        takes longer than the few rows it held when ``item`` came. Costed as it stood, every
        request of a closed-loop crowd was admitted with no slack left and answered late: a model
        whose time grows with its rows (ResNet-18 on a CPU: 49 ms at one row, 343 ms at eight)
        missed the deadline of all but the last request of each batch. So ``item``'s batch is
        costed grown to :meth:`reserve_rows` (the largest that takes at most half its time to the
        deadline), and a request whose joining would make one already in that batch miss its
        deadline is refused. The lazy disciplines never grow a batch past a member's deadline, so
        for them the batch is costed as it stands. A share of the predicted time (``wait_margin``,
        :data:`WAIT_MARGIN`) is kept as slack for the estimate's error.
        """
        start = max(now_s, free_at_s)
        before = self.ahead(queue, item)
        ahead = [q.rows for q in before]
        busy = (free_at_s > now_s if running is None else running) or bool(queue)
        greedy = busy and not self.lazy_drop
        grown = self.reserve_rows(item.deadline_s - now_s, service) if greedy else 0
        finish = start + self.drain_s([*ahead, item.rows], service, fill_to=grown)
        if self.max_queue is not None and len(queue) >= self.max_queue:
            first = self.drain_s([q.rows for q in self.order(queue)], service, batches=1)
            return self._refuse(finish, start + first - now_s, f"queue full ({len(queue)} queued)")
        retry = start + self.drain_s(ahead, service) - now_s
        planned = self._planned(finish, now_s)
        if planned > item.deadline_s and not (not busy and idle_s >= PROBE_S):
            late_ms = (planned - item.deadline_s) * 1000.0
            reason = f"cannot finish before its deadline ({len(ahead)} queued ahead, {late_ms:.0f} ms late)"
            return self._refuse(finish, retry, reason)
        members = self._batch_mates(before, item.rows) if greedy else []
        joined = self._planned(start + self.drain_s([*ahead, item.rows], service), now_s)
        if members and joined > min(m.deadline_s for m in members):
            return self._refuse(finish, retry, "joining its batch would make a queued request late")
        return Admission(True, finish)

    def _planned(self, finish: float, now_s: float) -> float:
        """``finish`` with room for the estimate's error: a share of the time until then."""
        return finish + self.wait_margin * (finish - now_s)

    def reserve_rows(self, budget_s: float, service: ServiceModel) -> int:
        """The rows a greedy batch is costed at for a request ``budget_s`` from its deadline: the
        largest batch (up to ``max_batch``) that takes at most :data:`RESERVE_SHARE` of that, or 1.
        Never ``max_batch`` regardless: when a full batch takes longer than the deadline allows (a
        large ``max_batch``, a host slower than profiled), no request could wait for one."""
        for rows in range(self.max_batch, 1, -1):
            if service.batch_s(rows) <= RESERVE_SHARE * budget_s:
                return rows
        return 1

    def _batch_mates(self, ahead: Sequence[Queued], rows: int) -> list[Queued]:
        """The requests of ``ahead`` (in service order) that a request of ``rows`` rows would share
        its batch with, packed as :meth:`drain_s` packs them."""
        mates: list[Queued] = []
        current = 0
        for q in ahead:
            if current and current + q.rows > self.max_batch:
                mates, current = [], 0
            mates.append(q)
            current += q.rows
        return mates if current and current + rows <= self.max_batch else []

    @staticmethod
    def _refuse(finish: float, retry_after_s: float, reason: str) -> Admission:
        return Admission(False, finish, max(retry_after_s, MIN_RETRY_S), reason)

    def drain_s(
        self, rows: Iterable[int], service: ServiceModel, batches: int | None = None, fill_to: int = 0
    ) -> float:
        """Seconds to serve requests of ``rows`` in order, packed into batches of ``max_batch`` rows
        (the first ``batches`` batches only, when given); the last batch costed as if it held at
        least ``fill_to`` rows (later requests will join it)."""
        total, current, done = 0.0, 0, 0
        for r in rows:
            if current and current + r > self.max_batch:
                total, current, done = total + service.batch_s(current), 0, done + 1
                if batches is not None and done >= batches:
                    return total
            current += r
        if current:
            current = max(current, fill_to)
        return total + (service.batch_s(current) if current else 0.0)


class Fifo(QueueDiscipline):
    """Arrival order, batches of up to ``max_batch`` rows; only requests already past their deadline
    are dropped (their callers have given up)."""

    name = "fifo"
    lazy_drop = False

    def order(self, queue: Sequence[Queued]) -> Sequence[Queued]:
        return queue


class BatchLazyDrop(QueueDiscipline):
    """Fixed-size batching with lazy dropping, as Clockwork and Jellyfish (4.3) do: arrival order;
    a request that cannot finish before its deadline, given the batch's service time, is dropped
    when it comes up instead of being run; a batch grows only while all its members still make it."""

    name = "batch-lazy-drop"
    lazy_drop = True

    def order(self, queue: Sequence[Queued]) -> Sequence[Queued]:
        return queue


class Edf(QueueDiscipline):
    """Earliest deadline first (ties by arrival), with the same lazy drop and batch bound."""

    name = "edf"
    lazy_drop = True

    def order(self, queue: Sequence[Queued]) -> Sequence[Queued]:
        return sorted(queue, key=lambda q: q.deadline_s)  # stable: arrival order breaks ties

    def ahead(self, queue: Sequence[Queued], item: Queued) -> list[Queued]:
        return [q for q in self.order(queue) if q.deadline_s <= item.deadline_s]


def warmup_sizes(service: ServiceModel, max_batch: int, budget_ms: float) -> tuple[int, ...]:
    """Batch sizes of the warm-up inferences, in order.

    Batch 1 first (the first answer, which every load has always paid); then the queue's max batch and
    batch 1 again, :data:`WARMUP_ROUNDS` times, each only while the profiled cost of all of them stays
    within ``budget_ms``: a GPU selects kernels per batch shape (seconds, on a first call), while
    on a CPU a large model's max batch costs seconds that a failover cannot spend.
    """
    sizes, spent = [1], service.batch_s(1) * 1000.0
    for rows in [max_batch, 1] * WARMUP_ROUNDS:
        cost = service.batch_s(rows) * 1000.0
        if spent + cost <= budget_ms:
            sizes.append(rows)
            spent += cost
    return tuple(sizes)


def warmup_budget_ms(load_ms: float) -> float:
    return max(WARMUP_MIN_BUDGET_MS, WARMUP_LOAD_SHARE * load_ms)


def warmup_ms(variant: Variant, max_batch: int) -> float:
    """The profiled cost of a load's warm-up inferences beyond ``load_ms``: a profiled load already
    ends with the first answer at batch 1 (the profiler's definition), so the warm-up's first
    inference is in it; the rest comes on top (before a background load is ready; after a recovery
    load's route, which waits for the first answer only: the runtime's agent defers it)."""
    service = ServiceModel(variant)
    sizes = warmup_sizes(service, max_batch, warmup_budget_ms(variant.load_ms))
    return sum(service.batch_s(rows) for rows in sizes[1:]) * 1000.0
