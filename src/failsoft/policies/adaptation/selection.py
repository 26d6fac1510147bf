"""Variant selection by simulated annealing (Jellyfish section 4.3, Algorithm 2), and the EDF baselines.

Central idea: a state is the multiset of variants the workers run; its value is what the DP mapping
(:mod:`~failsoft.policies.adaptation.mapping`) makes of it: the request rate served (O1), then the
accuracy per request (O2). Search the states with small random moves in two phases:

* DEGRADE: each worker's variant steps down one rung or stays (fair coin per worker). A neighbour is
  better if it serves more rate. Stop as soon as every client that the smallest variant could serve is
  served, or when the temperature reaches its floor.
* UPGRADE: each worker's variant steps down, stays or steps up. A neighbour that serves less than the
  best rate found is never taken; otherwise it is better if it is more accurate.

A worse neighbour is accepted with probability ``exp(-delta / T)`` (delta: the served rate as a share
of all clients' rate in DEGRADE, the accuracy per request in UPGRADE; both in [0, 1]). The temperature
starts at 0.0125 and is multiplied by 0.99 every step down to 0.0005: at most 321 steps per phase,
the paper's schedule. Values are memoised per multiset, the random generator is seeded.

One deviation, on purpose: the public code skips UPGRADE entirely when DEGRADE did not serve every
client (capacity too short for all), leaving every worker on a small variant; here UPGRADE then keeps
DEGRADE's best served rate as its bound and still raises accuracy.

The EDF baselines (:class:`EdfFixed`) are Clockwork-style: every worker runs one fixed variant
(``edf-small``, ``edf-medium``, ``edf-large``), all clients share one earliest-deadline-first queue
with lazy drop, no client is refused and the variants never change (clients still pick the largest
frame their uplink carries, ``network.carried_frame_rung``, as in section 7.3).
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

from failsoft.errors import ConfigError
from failsoft.policies.adaptation.interface import AdaptationPolicy
from failsoft.policies.adaptation.mapping import Table, place
from failsoft.policies.adaptation.model import Plan, Snapshot, WorkerPlan, evaluate

T_INITIAL = 0.0125
T_MIN = 0.0005
COOLING = 0.99
_EPS = 1e-9


class _Search:
    """One annealing run's memo: multiset of rungs -> (served share, accuracy per request)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.table = Table(snapshot)
        self.total = sum(self.table.weights) or 1
        self.memo: dict[tuple[int, ...], tuple[float, float]] = {}

    def value(self, state: tuple[int, ...]) -> tuple[float, float]:
        found = self.memo.get(state)
        if found is None:
            ordered, groups = self.table.chosen(state)
            w, acc = self.table.weights, self.table.accuracy
            served = sum(w[i] for g in groups for i in g)
            value = sum(acc[r] * w[i] for r, g in zip(ordered, groups, strict=True) for i in g)
            found = self.memo[state] = (served / self.total, value / self.total)
        return found


class JellyfishPolicy(AdaptationPolicy):
    """DP mapping inside simulated-annealing selection (sections 4.2-4.3). Seeded; incremental from
    the variants the workers hold now (``Snapshot.current``)."""

    name = "jellyfish"

    def __init__(
        self, seed: int = 0, t_initial: float = T_INITIAL, t_min: float = T_MIN, cooling: float = COOLING
    ) -> None:
        if not (0 < t_min < t_initial and 0 < cooling < 1):
            raise ConfigError(
                "annealing needs 0 < t_min < t_initial and cooling in (0, 1); "
                f"got t_min {t_min!r}, t_initial {t_initial!r}, cooling {cooling!r}"
            )
        self.rng = random.Random(seed)
        self.t_initial, self.t_min, self.cooling = t_initial, t_min, cooling

    def plan(self, snapshot: Snapshot) -> Plan:
        if not snapshot.workers:
            return evaluate(snapshot, self.name, ())
        search = _Search(snapshot)
        top = snapshot.ladder.size - 1
        start = tuple(sorted(snapshot.start))
        t = search.table
        servable = sum(w for w, caps in zip(t.weights, t.caps, strict=True) if caps[0] >= 0) / search.total
        best, steps_down = self._degrade(search, start, servable)
        best, steps_up = self._upgrade(search, best, top)
        groups = search.table.map(best)
        rungs = place(snapshot.start, best)
        by_rung: dict[int, list[tuple[int, tuple]]] = {}
        for rung, group in groups:
            by_rung.setdefault(rung, []).append((rung, group))
        placed = [by_rung[r].pop() for r in rungs]
        return evaluate(
            snapshot,
            self.name,
            placed,
            degrade_steps=steps_down,
            upgrade_steps=steps_up,
            states=len(search.memo),
        )

    def _degrade(
        self, search: _Search, start: tuple[int, ...], servable: float
    ) -> tuple[tuple[int, ...], int]:
        cur = best = start
        t, steps = self.t_initial, 0
        while t > self.t_min and search.value(best)[0] < servable - _EPS:
            bits = self.rng.getrandbits(len(cur))  # per worker: step down (1) or stay (0)
            new = tuple(sorted(max(0, r - ((bits >> k) & 1)) for k, r in enumerate(cur)))
            s_new, a_new = search.value(new)
            s_cur = search.value(cur)[0]
            if s_new > s_cur + _EPS or self.rng.random() < math.exp(-abs(s_new - s_cur) / t):
                cur = new
            if (s_new, a_new) > search.value(best):
                best = new
            t, steps = t * self.cooling, steps + 1
        return best, steps

    def _upgrade(self, search: _Search, start: tuple[int, ...], top: int) -> tuple[tuple[int, ...], int]:
        cur = best = start
        bound = search.value(start)[0]
        t, steps = self.t_initial, 0
        while t > self.t_min:
            new = tuple(sorted(min(top, max(0, r + self.rng.randrange(-1, 2))) for r in cur))
            s_new, a_new = search.value(new)
            t, steps = t * self.cooling, steps + 1
            if s_new < bound - _EPS:
                continue
            a_cur = search.value(cur)[1]
            if a_new > a_cur + _EPS or self.rng.random() < math.exp(-abs(a_new - a_cur) / t):
                cur = new
            if (s_new, a_new) > search.value(best):
                best = new
        return best, steps


class EdfFixed(AdaptationPolicy):
    """Clockwork-style baseline: one fixed variant everywhere, a shared EDF queue, no re-planning.

    The plan lists no per-worker clients (``pooled``); ``served_fps`` and ``accuracy`` are what the
    pool could carry at most: the clients whose budget fits the variant at batch 1, up to the workers'
    total throughput at the largest batch.
    """

    name: ClassVar[str]
    size: ClassVar[str]

    def __init__(self, seed: int = 0) -> None:
        """``seed`` is accepted like every adaptation policy's and unused: the baseline is deterministic."""
        self.seed = seed

    def rung(self, snapshot: Snapshot) -> int:
        """The smallest, middle or largest *model* (a low-resolution feed is not a variant of its own;
        the baseline's clients still send such frames when their uplink needs it)."""
        models = snapshot.ladder.models
        m = len(models)
        return models[{"small": 0, "medium": (m - 1) // 2, "large": m - 1}[self.size]]

    def plan(self, snapshot: Snapshot) -> Plan:
        ladder = snapshot.ladder
        rung = self.rung(snapshot)
        batch = ladder.max_batch
        fits = [c for c in snapshot.clients if c.max_batch(ladder, rung) >= 1]
        capacity = len(snapshot.workers) * float(ladder.throughput_rps[rung].max())
        served = min(sum(c.fps for c in fits), capacity)
        total = snapshot.total_fps
        workers = tuple(WorkerPlan(w, rung, batch) for w in snapshot.workers)
        missing = {c.name for c in fits}
        unserved = tuple(c.name for c in snapshot.clients if c.name not in missing)
        accuracy = served * float(ladder.accuracy[rung]) / total if total else 0.0
        return Plan(self.name, workers, unserved, served, accuracy, pooled=True)


class EdfSmall(EdfFixed):
    name = "edf-small"
    size = "small"


class EdfMedium(EdfFixed):
    name = "edf-medium"
    size = "medium"


class EdfLarge(EdfFixed):
    name = "edf-large"
    size = "large"
