"""Serving queues: one queue and one worker thread per loaded model, in the agent.

Ray runs an agent's methods on a pool of threads; without a queue, every request would call the
model at once, with no order, no batching, no deadline and no bound. Instead, :meth:`Agent.infer
<failsoft.runtime.agent.Agent.infer>` hands its rows to the model's :class:`ServingQueue` and waits:

* **deadlines** travel with requests: the caller's time left (``timeout_s``) becomes a deadline on
  this process's monotonic clock, the moment the request arrives;
* **admission**: the queue's discipline (:mod:`failsoft.policies.queueing`) estimates when a new
  request would finish behind the work already queued and refuses it at once, with
  :class:`~failsoft.errors.OverloadedError` and a ``retry_after_s`` estimate, when it cannot finish
  before its deadline or the queue holds ``max_queue`` requests (the gateway answers 503 with
  ``Retry-After``, never a wait that ends in a timeout);
* **batching**: the worker asks the discipline for the next batch, concatenates its rows, runs one
  ``predict`` and splits the outputs back; requests the discipline drops (past their deadline, or,
  for the lazy disciplines, unable to make it) are answered :class:`~failsoft.errors.DroppedError`
  (a :class:`~failsoft.errors.DeadlineExceededError`) without running;
* **a lone request waits for nobody**: the data plane's socket thread queues what it read and then
  calls :meth:`ServingQueue.run_here`, which runs the next batch in that thread when the worker is
  idle and the model quick (:data:`INLINE_MAX_S`): a lone request's answer then leaves without a
  hand-off between threads, and batching starts with the requests that arrive while one runs;
  one batch runs at a time either way;
* **cancellation**: :meth:`ServingQueue.cancel` withdraws a queued request (its caller timed out or
  moved to another server); its waiting thread is released at once;
* **unload**: :meth:`ServingQueue.close` refuses new requests and answers the queued ones
  :class:`~failsoft.errors.ModelNotLoadedError` (the gateway's router retries those on the app's
  next route, within their deadline); the batch running completes on the model, which the queue
  holds by reference: nothing unloads a model from under a running batch.

Service times are the variant's measured batch profile, calibrated as the queue runs: after every
batch the ratio of measured to profiled time updates ``scale`` (an exponentially weighted mean), so
estimates follow the machine as it is now (a noisy neighbour, a GPU that is not the profiled one).
An injected slowdown (``failsoft chaos slow``) delays every batch and is added to the estimates.

The worker thread inherits the CPU priority of the thread that calls :meth:`ServingQueue.start`:
agents start it from one of Ray's threads, at the agent's own niceness, never from a load thread
(which runs lower). :func:`warm_up` is what an agent runs before a load returns (Triton's
``model_warmup``); a recovery load runs only its first answer then and the rest after the route is
published, and hands the timings to :meth:`ServingQueue.warmed`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    DroppedError,
    FailsoftError,
    ModelNotLoadedError,
    OverloadedError,
    ServingError,
)
from failsoft.policies.queueing import Queued, QueueDiscipline, ServiceModel

log = logging.getLogger(__name__)
LEARN = 0.2  # weight of the latest batch in the service-time calibration
# A queue plans to answer this long before the caller's deadline: the answer still has to travel
# back (Ray's return, the gateway's event loop). Measured: without it, the last batch admitted under
# a burst on the 2-core machine reached the gateway 1-20 ms after its deadline (504s).
ANSWER_MARGIN_S = 0.025
RATIO_BOUNDS = (1e-3, 1e3)  # one freak measurement never makes the estimate zero or absurd
# A model whose batch of one is estimated under this long may run in the thread that queued the
# request, when the worker is idle (:meth:`ServingQueue.run_here`): the data plane's socket thread
# is then kept from its socket no longer than this.
INLINE_MAX_S = 0.005

Predict = Callable[[np.ndarray], np.ndarray]


class _Ticket:
    """One request: its rows, its place in the discipline's view, and the future its caller waits on."""

    __slots__ = ("batch_rows", "future", "item", "request_id", "rows", "stamps")

    def __init__(self, rows: np.ndarray, request_id: str | None) -> None:
        self.rows = rows
        self.request_id = request_id
        self.item: Queued | None = None
        self.future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        # wall-clock ns: queued, taken into a batch, predict started, predict ended (traces)
        self.stamps: tuple[int, int, int, int] = (time.time_ns(), 0, 0, 0)
        self.batch_rows = 0  # the rows of the batch it ran in


@dataclasses.dataclass(frozen=True, slots=True)
class BatchDone:
    """One batch a queue answered, for metrics: its rows, each request's wait in the queue, and
    predict's time (seconds)."""

    rows: int
    waits_s: tuple[float, ...]
    predict_s: float


@dataclasses.dataclass(slots=True)
class QueueCounters:
    """What a queue did since it started (requests, except ``batches`` and ``rows``)."""

    served: int = 0
    batches: int = 0
    rows: int = 0
    refused: int = 0
    dropped: int = 0
    cancelled: int = 0
    expired: int = 0  # the caller's deadline passed while it waited
    failed: int = 0
    # where served requests' time went (seconds, summed; a few additions per batch): waiting in the
    # queue (summed over requests), assembling batches, predict, splitting and handing back answers
    wait_s: float = 0.0
    batch_s: float = 0.0
    predict_s: float = 0.0
    answer_s: float = 0.0


class ServingQueue:
    """One loaded model's queue and worker. Thread-safe; ``start`` once, ``close`` once."""

    def __init__(
        self,
        name: str,
        predict: Predict,
        input_shape: Sequence[int],
        discipline: QueueDiscipline,
        service: ServiceModel,
        *,
        delay_s: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.monotonic,
        learn: float = LEARN,
        margin_s: float = ANSWER_MARGIN_S,
        on_batch: Callable[[BatchDone], None] | None = None,
    ) -> None:
        self.name = name
        self._on_batch = on_batch  # metrics: called by the worker after each batch answered
        self._predict = predict  # held by reference until the worker exits
        self._input_shape = tuple(input_shape)
        self.discipline = discipline
        self._service = service
        self._service_now = service  # self.service's last value
        self._delay_s = delay_s
        self._clock = clock
        self._learn = learn
        self._margin_s = margin_s
        self._fixed_ms = 0.0  # learned cost of a batch outside predict: hand-offs, copies, timers
        self._cond = threading.Condition()
        self._queue: list[_Ticket] = []  # arrival order
        self._by_id: dict[str, _Ticket] = {}
        self._running_until: float | None = None  # estimated end of the batch in flight
        self._idle_from = clock()  # when the last batch ended (admission's probe after a long idle)
        self._busy = False  # a batch runs (in the worker, or in run_here's caller)
        self._closed = False
        self.counters = QueueCounters()
        self._thread = threading.Thread(target=self._work, name=f"serve-{name}", daemon=True)

    # life cycle ---------------------------------------------------------------------------------
    def start(self) -> ServingQueue:
        """Start the worker: it runs at the CPU priority of the calling thread."""
        self._thread.start()
        return self

    def close(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests, answer queued ones ModelNotLoadedError, let the running batch finish.

        Returns True once the worker has exited (within ``timeout_s``): the model is then free to close.
        """
        with self._cond:
            self._closed = True
            queued, self._queue, self._by_id = self._queue, [], {}
            self._cond.notify_all()
        for ticket in queued:
            ticket.future.set_exception(ModelNotLoadedError(f"{self.name}: unloaded while queued"))
        if self._thread.ident is None:  # never started
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def worker_native_id(self) -> int | None:
        return self._thread.native_id

    # requests ------------------------------------------------------------------------------------
    def infer(self, batch: Any, timeout_s: float | None = None, request_id: str | None = None) -> np.ndarray:
        """Queue ``batch``, wait for its answer; ``timeout_s`` None: no deadline."""
        ticket = self.submit(batch, timeout_s, request_id)
        return self.wait(ticket)

    def submit(
        self, batch: Any, timeout_s: float | None = None, request_id: str | None = None, wake: bool = True
    ) -> _Ticket:
        """Queue ``batch`` (admission decides), returning the ticket to :meth:`wait` on.

        ``wake`` False: the caller calls :meth:`run_here` next (the worker is woken only if the
        batch cannot run there)."""
        ticket = _Ticket(self._rows_of(batch), request_id)
        if timeout_s is not None and timeout_s <= self._margin_s:
            raise DroppedError(f"{self.name}: the request arrived with no time left")
        with self._cond:
            if self._closed:
                raise ModelNotLoadedError(f"{self.name}: not loaded (unloaded)")
            now = self._clock()
            deadline = math.inf if timeout_s is None else now + timeout_s - self._margin_s
            ticket.item = Queued(ticket, now, deadline, len(ticket.rows))
            verdict = self.discipline.admit(
                [t.item for t in self._queue if t.item is not None],
                ticket.item,
                now,
                self._running_until if self._running_until is not None else now,
                self.service,
                running=self._running_until is not None,
                idle_s=0.0 if self._running_until is not None or self._queue else now - self._idle_from,
            )
            if not verdict.admitted:
                self.counters.refused += 1
                retry = verdict.retry_after_s
                message = f"{self.name}: overloaded, {verdict.reason}; retry in {retry * 1000:.0f} ms"
                raise OverloadedError(message, retry)
            self._queue.append(ticket)
            if request_id is not None:
                self._by_id[request_id] = ticket
            if wake:
                self._cond.notify_all()
        return ticket

    def run_here(self) -> bool:
        """Run the next batch in the calling thread if the worker is idle and the model is quick
        (:data:`INLINE_MAX_S`, no injected slowdown); else leave it to the worker, woken. True when
        a batch ran here.

        The data plane's socket thread calls it after queueing what it read: a lone request is then
        answered without two hand-offs between threads (socket to worker, worker to socket), which
        on a small model cost as much as ``predict``; under load the requests that arrived meanwhile
        form the next batch as they would in the worker. A batch runs in one thread at a time."""
        with self._cond:
            if not self._queue or self._closed:
                return False
            if self._busy or not self._quick():
                self._cond.notify_all()
                return False
            run, drop = self._take(self._clock())
        self._drop(drop)
        if not run:
            return False
        self._run(run)
        return True

    def _quick(self) -> bool:
        return self._delay_s() <= 0 and self.service.batch_s(1) <= INLINE_MAX_S

    def wait(self, ticket: _Ticket) -> np.ndarray:
        """The answer; at the ticket's deadline the request is withdrawn and DeadlineExceededError."""
        assert ticket.item is not None
        left = ticket.item.deadline_s + self._margin_s - self._clock()  # the caller's own deadline
        try:
            return ticket.future.result(timeout=None if math.isinf(left) else max(left, 0.0))
        except concurrent.futures.TimeoutError:
            self._withdraw(ticket)
            with self._cond:
                self.counters.expired += 1
            raise DeadlineExceededError(f"{self.name}: no answer before the request's deadline") from None

    def cancel(self, request_id: str) -> bool:
        """Withdraw a queued request; False when it is not queued here (done, running or unknown)."""
        with self._cond:
            ticket = self._by_id.get(request_id)
        if ticket is None or not self._withdraw(ticket):
            return False
        with self._cond:
            self.counters.cancelled += 1
        ticket.future.set_exception(DeadlineExceededError(f"{self.name}: request {request_id!r} cancelled"))
        return True

    def _withdraw(self, ticket: _Ticket) -> bool:
        with self._cond:
            if ticket not in self._queue:
                return False
            self._queue.remove(ticket)
            if ticket.request_id is not None and self._by_id.get(ticket.request_id) is ticket:
                del self._by_id[ticket.request_id]
            return True

    def _rows_of(self, batch: Any) -> np.ndarray:
        arr = np.asarray(batch)
        # O: a BYTES input (texts); V: a model's several named inputs, one field each; queued as they are
        if arr.dtype.kind not in "fiuOV":
            raise ConfigError(f"{self.name}: expected a float32 batch, got dtype {arr.dtype}")
        if arr.ndim != len(self._input_shape) + 1 or tuple(arr.shape[1:]) != self._input_shape:
            want = ", ".join(map(str, self._input_shape))
            raise ConfigError(f"{self.name} expects a batch of shape (N, {want}), got {tuple(arr.shape)}")
        if arr.shape[0] == 0:
            raise ConfigError(f"{self.name}: empty batch")
        return arr if arr.dtype.kind in "OV" else np.ascontiguousarray(arr, dtype=np.float32)

    # the worker ----------------------------------------------------------------------------------
    @property
    def service(self) -> ServiceModel:
        """The service-time model now: the calibrated profile, plus a batch's measured fixed cost and
        any injected delay."""
        overhead_ms = max(self._delay_s(), 0.0) * 1000.0 + self._fixed_ms
        now = self._service_now  # made once per batch (calibration) or slowdown, not per request
        if now.overhead_ms != overhead_ms or now.scale != self._service.scale:
            now = self._service_now = dataclasses.replace(self._service, overhead_ms=overhead_ms)
        return now

    def _work(self) -> None:
        while True:
            with self._cond:
                while (not self._queue or self._busy) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                run, drop = self._take(self._clock())
            self._drop(drop)
            if run:
                self._run(run)

    def _drop(self, drop: list[_Ticket]) -> None:
        for ticket in drop:
            ticket.future.set_exception(
                DroppedError(f"{self.name}: dropped, it could not be answered before its deadline")
            )

    def _take(self, now: float) -> tuple[list[_Ticket], list[_Ticket]]:
        """Under the lock: the discipline's next batch, removed from the queue."""
        service = self.service
        batch = self.discipline.next_batch([t.item for t in self._queue if t.item is not None], now, service)
        run: list[_Ticket] = [item.key for item in batch.run]
        drop: list[_Ticket] = [item.key for item in batch.drop]
        taken = {id(t) for t in run} | {id(t) for t in drop}
        self._queue = [t for t in self._queue if id(t) not in taken]
        for ticket in run + drop:
            if ticket.request_id is not None and self._by_id.get(ticket.request_id) is ticket:
                del self._by_id[ticket.request_id]
        self.counters.dropped += len(drop)
        if run:
            self._running_until = now + service.batch_s(batch.rows)
            self._busy = True
        return run, drop

    def _run(self, run: list[_Ticket]) -> None:
        taken, taken_ns = time.perf_counter(), time.time_ns()
        now = self._clock()
        waits = tuple(max(now - t.item.arrival_s, 0.0) for t in run if t.item is not None)
        waited = sum(waits)
        delay = self._delay_s()
        if delay > 0:  # injected slowdown: the whole batch waits
            time.sleep(delay)
        rows = run[0].rows if len(run) == 1 else np.concatenate([t.rows for t in run])
        started = time.perf_counter()
        try:
            out = self._predict(rows)
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, FailsoftError)
                else ServingError(f"{self.name}: inference failed: {exc}")
            )
            for ticket in run:
                ticket.future.set_exception(error)
            with self._cond:
                self.counters.failed += len(run)
                self._idle()
            return
        predicted = time.perf_counter()
        elapsed_ms = (predicted - started) * 1000.0
        predicted_ns = time.time_ns()
        started_ns = predicted_ns - int((predicted - started) * 1e9)
        parts = [out] if len(run) == 1 else np.split(out, np.cumsum([len(t.rows) for t in run])[:-1])
        for ticket, part in zip(run, parts, strict=True):
            ticket.stamps = (ticket.stamps[0], taken_ns, started_ns, predicted_ns)
            ticket.batch_rows = len(rows)
            ticket.future.set_result(part)
        done = time.perf_counter()
        cycle_ms = (done - taken) * 1000.0
        with self._cond:
            c = self.counters
            c.served += len(run)
            c.batches += 1
            c.rows += len(rows)
            c.wait_s += max(waited, 0.0)
            c.batch_s += started - taken - delay
            c.predict_s += predicted - started
            c.answer_s += done - predicted
            self._idle()
            self._calibrate(len(rows), elapsed_ms, max(cycle_ms - elapsed_ms - delay * 1000.0, 0.0))
        if self._on_batch is not None:
            try:
                self._on_batch(BatchDone(len(rows), waits, predicted - started))
            except Exception:  # metrics never stop a queue
                log.exception("%s: recording a batch's metrics failed", self.name)

    def _idle(self) -> None:
        """Under the lock, once a batch is answered: the next may start (the worker, if it waits)."""
        self._running_until = None
        self._idle_from = self._clock()
        self._busy = False
        if self._queue:
            self._cond.notify_all()

    def _calibrate(self, rows: int, predict_ms: float, fixed_ms: float) -> None:
        """Per-row cost (``scale`` of the profile) from predict's time; fixed cost from the rest."""
        profiled = self._service.profile_ms(rows)
        if self._learn <= 0 or profiled <= 0:
            return
        ratio = min(max(predict_ms / profiled, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        scale = (1 - self._learn) * self._service.scale + self._learn * ratio
        self._service = dataclasses.replace(self._service, scale=scale)
        self._fixed_ms = (1 - self._learn) * self._fixed_ms + self._learn * fixed_ms

    def warmed(self, timings: Sequence[tuple[int, float]]) -> bool:
        """Calibrate to a warm-up run after the queue started (a recovery load's deferred warm-up:
        :func:`calibrated`), unless a batch already has: real batches are better evidence. True
        when applied."""
        with self._cond:
            if self.counters.batches > 0:
                return False
            self._service = calibrated(self._service, timings)
            return True

    # reports -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._cond:
            counters = dataclasses.asdict(self.counters)
            queued = len(self._queue)
            scale = self._service.scale
        nice = None
        if self._thread.native_id is not None and self._thread.is_alive():
            try:
                nice = os.getpriority(os.PRIO_PROCESS, self._thread.native_id)
            except OSError:
                nice = None
        return {
            **counters,
            "queued": queued,
            "discipline": self.discipline.name,
            "max_batch": self.discipline.max_batch,
            "scale": scale,
            "fixed_ms": self._fixed_ms,
            "nice": nice,
        }


def warm_up(predict: Predict, input_shape: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, float]]:
    """Run the warm-up inferences (zeros, as Triton's ``zero_data``); (rows, ms) of each."""
    timings = []
    for rows in sizes:
        started = time.perf_counter()
        predict(np.zeros((rows, *input_shape), dtype=np.float32))
        timings.append((rows, (time.perf_counter() - started) * 1000.0))
    return timings


def calibrated(service: ServiceModel, timings: Sequence[tuple[int, float]]) -> ServiceModel:
    """``service`` scaled to the warm-up's measurements, leaving out each size's first (cold) run."""
    seen: set[int] = set()
    ratios = []
    for rows, ms in timings:
        if rows in seen and service.profile_ms(rows) > 0:
            ratios.append(min(max(ms / service.profile_ms(rows), RATIO_BOUNDS[0]), RATIO_BOUNDS[1]))
        seen.add(rows)
    return dataclasses.replace(service, scale=statistics.median(ratios)) if ratios else service
