"""The data every adaptation policy shares: the variant ladder, a frozen snapshot in, a frozen plan out.

A :class:`Ladder` is the family a slo service serves, as Jellyfish's scheduler sees it (section 4.1,
Table 1): variants ordered by input size, each with its accuracy ``a_j``, its input frame size ``s_j``
and its latency ``l_j(b)`` for every batch size ``b`` in ``1..B`` (from
:meth:`~failsoft.domain.Variant.latency_at`, repaired to be non-decreasing in ``b`` and in ``j`` as the
paper assumes), hence its throughput ``t_j(b) = b / l_j(b)``.

A :class:`Snapshot` is what the controller (or the simulator) knows at one instant: the clients with
their frame rate and their latency budget per variant (section 3.3, computed by
:func:`failsoft.policies.adaptation.network.latency_budgets_ms`), and the live workers with the variant
each holds now. A policy turns it into a :class:`Plan`: per worker the variant, the batch size and the
clients mapped to it; the clients nobody can serve; and the plan's value (:func:`evaluate`).

The objective (eq. 2) is lexicographic, as Algorithm 2's two criteria: first the request rate served
(O1), then the accuracy per request (O2) = ``sum(a_j * fps_i) / sum(fps_i)`` over all clients, a client
left unserved counting 0. The heuristic and the exact MILP are measured by the same function.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from failsoft.domain import Variant
from failsoft.errors import ConfigError, PlanningError

QUEUE_FACTOR = 2.0  # eq. 6: a request may wait for one batch, then run in its own (budget >= 2 l_j(b))


@dataclass(frozen=True)
class Rung:
    """One variant of the ladder: the model, the frame size it wants, its declared accuracy.

    A rung may also be a *low-resolution feed* of a model (``frame_px`` below ``input_px``): the
    client sends smaller frames, which the server upscales to the model's input (the Jellyfish paper,
    section 3.1: the client sends "the maximum possible size" when the network cannot carry the
    model's own). Such a rung costs what the model costs, carries ``frame_kbit`` of the smaller frame,
    and scores ``frame_accuracy``, a number its maker must declare (upscaling adds no detail).
    """

    variant: Variant
    input_px: int  # square input of the model
    frame_kbit: float  # the compressed frame on the wire (network.frame_kbit of frame_px)
    frame_px: int | None = None  # the frame the client sends, when smaller than input_px
    frame_accuracy: float | None = None  # declared accuracy of those upscaled frames

    def __post_init__(self) -> None:
        if (self.frame_px is None) != (self.frame_accuracy is None):
            raise ConfigError(
                f"variant {self.variant.name!r}: a low-resolution rung needs both frame_px and frame_accuracy"
            )
        if self.frame_px is not None and self.frame_accuracy is not None:
            if not 1 <= self.frame_px < self.input_px:
                raise ConfigError(
                    f"variant {self.variant.name!r}: frame_px {self.frame_px!r} must be below the "
                    f"model's input {self.input_px} px"
                )
            if not 0 < self.frame_accuracy <= self.variant.accuracy:
                raise ConfigError(
                    f"variant {self.variant.name!r}: upscaled frames of {self.frame_px} px cannot score "
                    f"{self.frame_accuracy!r} (must be in (0, {self.variant.accuracy!r}])"
                )

    @property
    def upscaled(self) -> bool:
        """True for a low-resolution feed of the model (frames smaller than its input)."""
        return self.frame_px is not None

    @property
    def px(self) -> int:
        """The frame size the client sends for this rung."""
        return self.frame_px if self.frame_px is not None else self.input_px

    @property
    def name(self) -> str:
        return f"{self.variant.name}@{self.frame_px}px" if self.frame_px is not None else self.variant.name

    @property
    def accuracy(self) -> float:
        return self.frame_accuracy if self.frame_accuracy is not None else self.variant.accuracy


@dataclass(frozen=True)
class Ladder:
    """A family's variants by growing input size, with their per-batch latency (ms) and throughput.

    ``latency_ms[j, b-1]`` is ``l_j(b)``; ``throughput_rps[j, b-1]`` is ``t_j(b)``. Both arrays are
    read-only. Build it with :meth:`build`.
    """

    rungs: tuple[Rung, ...]
    latency_ms: np.ndarray
    throughput_rps: np.ndarray

    @classmethod
    def build(cls, rungs: Sequence[Rung], max_batch: int, batch_cost: float = 1.0) -> Ladder:
        """The ladder of ``rungs`` (ordered by input size here) with batches up to ``max_batch``.

        Accuracy must grow with input size (the paper drops a variant that is larger but less
        accurate; we refuse it, naming it, so the caller decides). Latency is made non-decreasing in
        batch size and across variants at the same batch size, as the public code's profile reader does.
        """
        if not rungs:
            raise ConfigError("an adaptation ladder needs at least one variant")
        if not 1 <= max_batch <= 64:
            raise ConfigError(f"max_batch must be in 1..64; got {max_batch!r}")
        ordered = sorted(rungs, key=lambda r: (r.px, r.accuracy))
        for lo, hi in itertools.pairwise(ordered):
            if hi.accuracy < lo.accuracy:
                raise ConfigError(
                    f"variant {hi.name!r} (input {hi.px} px) is less accurate than "
                    f"{lo.name!r} (input {lo.px} px): {hi.accuracy!r} < {lo.accuracy!r}"
                )
        lat = np.array(
            [[r.variant.latency_at(b, batch_cost) for b in range(1, max_batch + 1)] for r in ordered],
            dtype=float,
        )
        lat = np.maximum.accumulate(np.maximum.accumulate(lat, axis=1), axis=0)
        thr = np.arange(1, max_batch + 1, dtype=float)[None, :] / lat * 1000.0
        lat.setflags(write=False)
        thr.setflags(write=False)
        return cls(tuple(ordered), lat, thr)

    @property
    def size(self) -> int:
        return len(self.rungs)

    @property
    def max_batch(self) -> int:
        return int(self.latency_ms.shape[1])

    @property
    def accuracy(self) -> np.ndarray:
        return np.array([r.accuracy for r in self.rungs])

    @property
    def models(self) -> tuple[int, ...]:
        """The rungs that feed a model its own input size (not a low-resolution feed), by size."""
        return tuple(j for j, r in enumerate(self.rungs) if not r.upscaled)

    def index(self, name: str) -> int:
        for j, r in enumerate(self.rungs):
            if r.name == name:
                return j
        raise ConfigError(f"variant {name!r} is not in the ladder ({', '.join(r.name for r in self.rungs)})")


@dataclass(frozen=True)
class ClientSnapshot:
    """A client as the scheduler sees it: its frame rate and its latency budget for each variant."""

    name: str
    fps: float
    budget_ms: tuple[float, ...]  # L_ij per rung; 0: this variant cannot serve the client at all

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ConfigError(f"client {self.name!r}: fps must be a positive number; got {self.fps!r}")

    def max_batch(self, ladder: Ladder, j: int) -> int:
        """The largest batch ``b`` of rung ``j`` with ``2 l_j(b) <= L_ij`` (eq. 6); 0 when none."""
        limit = self.budget_ms[j] / QUEUE_FACTOR
        return int(np.searchsorted(ladder.latency_ms[j], limit, side="right"))


@dataclass(frozen=True)
class Snapshot:
    """Frozen input of one planning round: the ladder, the clients, the live workers and what they hold."""

    ladder: Ladder
    clients: tuple[ClientSnapshot, ...]
    workers: tuple[str, ...]
    current: tuple[int, ...] = ()  # rung each worker holds now (same order as workers); () = smallest

    def __post_init__(self) -> None:
        m = self.ladder.size
        for c in self.clients:
            if len(c.budget_ms) != m:
                raise ConfigError(f"client {c.name!r} has {len(c.budget_ms)} budgets for {m} variants")
        if self.current and (
            len(self.current) != len(self.workers) or not all(0 <= j < m for j in self.current)
        ):
            raise ConfigError(f"current variants {self.current!r} do not match workers {self.workers!r}")
        if len({c.name for c in self.clients}) != len(self.clients):
            raise ConfigError("client names in a snapshot must be unique")

    @property
    def start(self) -> tuple[int, ...]:
        return self.current or (0,) * len(self.workers)

    @property
    def total_fps(self) -> float:
        return float(sum(c.fps for c in self.clients))


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker does until the next plan: run ``rung`` in batches of ``batch`` for ``clients``."""

    worker: str
    rung: int
    batch: int  # 0 when no client is mapped to it
    clients: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A policy's answer. ``pooled``: all workers serve one shared EDF queue (the Clockwork baselines)
    instead of the clients mapped to them; ``stats`` are the policy's own counters (iterations,
    MILP status and gap)."""

    policy: str
    workers: tuple[WorkerPlan, ...]
    unserved: tuple[str, ...]
    served_fps: float
    accuracy: float  # eq. 2 per request: sum(a_j fps_i) / total fps, unserved clients count 0
    pooled: bool = False
    stats: tuple[tuple[str, float | str | None], ...] = ()

    def worker_of(self, client: str) -> WorkerPlan | None:
        for w in self.workers:
            if client in w.clients:
                return w
        return None

    @property
    def objective(self) -> tuple[float, float]:
        return (round(self.served_fps, 9), self.accuracy)


def smallest_batch(ladder: Ladder, j: int, rate: float) -> int:
    """The smallest batch whose throughput carries ``rate`` requests/s (0 for no load; -1 if none)."""
    if rate <= 0:
        return 0
    fits = np.nonzero(ladder.throughput_rps[j] >= rate - 1e-9)[0]
    return int(fits[0]) + 1 if fits.size else -1


def feasible(snapshot: Snapshot, rung: int, clients: Sequence[ClientSnapshot]) -> int:
    """The batch at which rung ``rung`` serves all ``clients`` on one worker (eqs. 6-7), or -1."""
    b = smallest_batch(snapshot.ladder, rung, sum(c.fps for c in clients))
    if b <= 0:
        return b
    return b if all(c.max_batch(snapshot.ladder, rung) >= b for c in clients) else -1


def evaluate(
    snapshot: Snapshot,
    policy: str,
    groups: Sequence[tuple[int, Sequence[ClientSnapshot]]],
    **stats: float | str | None,
) -> Plan:
    """The plan that gives worker ``k`` rung ``groups[k][0]`` and clients ``groups[k][1]``.

    Every group must be feasible (a :class:`~failsoft.errors.PlanningError` names the worker if not);
    the batch is the smallest one carrying the group's rate, which leaves the most latency slack.
    """
    workers, served, value = [], 0.0, 0.0
    mapped: set[str] = set()
    acc = snapshot.ladder.accuracy
    for worker, (rung, group) in zip(snapshot.workers, groups, strict=True):
        batch = feasible(snapshot, rung, group)
        if batch < 0:
            raise PlanningError(
                f"{policy}: worker {worker!r} cannot serve {[c.name for c in group]} with rung {rung}"
            )
        rate = sum(c.fps for c in group)
        served, value = served + rate, value + rate * acc[rung]
        mapped.update(c.name for c in group)
        workers.append(WorkerPlan(worker, rung, batch, tuple(c.name for c in group)))
    total = snapshot.total_fps
    unserved = tuple(c.name for c in snapshot.clients if c.name not in mapped)
    return Plan(
        policy, tuple(workers), unserved, served, value / total if total else 0.0, stats=tuple(stats.items())
    )
