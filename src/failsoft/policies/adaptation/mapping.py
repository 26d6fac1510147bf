"""Client-to-worker mapping by dynamic programming over batch sizes (Jellyfish section 4.2, Algorithm 1).

Central idea: the most accurate variant should carry the most request rate. So take the workers'
variants from the most accurate down; for each, pick among the clients still unmapped the subset with
the largest total frame rate that one worker running it can serve, and remove them.

"The subset one worker can serve" depends on the batch size: a larger batch carries more rate
(``t_j(b)``) but takes longer (``2 l_j(b)`` must fit every member's budget). With clients sorted by
budget, descending, a batch feasible for client ``i`` is feasible for everyone before it, so the
subset whose last (lowest-budget) member is ``i`` may carry at most ``cap_i = max_{b <= bmax_i} t_j(b)``.
That makes it one 0-1 knapsack (weight = value = frame rate) whose capacity shrinks row by row, solved
for all batch sizes at once. Rates are counted in units of the greatest common divisor of the frame
rates (the public code hard-codes 5 fps, which is wrong for any other mix), capacities rounded down,
so the DP is exact for the instance. Reachable sums are kept as Python integers used as bit sets
(``R | (R << w)``), which makes a row a few machine operations.

Ties between subsets of the same rate keep the higher-budget clients (the paper picks at random).
The batch a worker then runs is the smallest that carries its rate: it leaves the most latency slack.
:func:`place` pairs a new multiset of variants with the workers so that each worker's variant moves as
little as possible (section 4.4: sorted old against sorted new, optimal for total distance on a line).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import reduce

import numpy as np

from failsoft.policies.adaptation.model import ClientSnapshot, Snapshot

Groups = tuple[tuple[int, tuple[ClientSnapshot, ...]], ...]  # (rung, clients) per slot


def rate_units(fps: Sequence[float]) -> tuple[list[int], float]:
    """Integer weights for frame rates and the rate one unit stands for (their exact common divisor).

    Rates are read as fractions with denominators up to 1000 (15, 25, 12.5 and 29.97 are all exact).
    """
    fractions = [Fraction(f).limit_denominator(1000) for f in fps]
    if not fractions:
        return [], 1.0
    denominator = reduce(math.lcm, (f.denominator for f in fractions), 1)
    numerators = [int(f * denominator) for f in fractions]
    g = reduce(math.gcd, numerators)
    unit = g / denominator
    return [n // g for n in numerators], unit


class Table:
    """Per-snapshot numbers the DP reads again and again: integer weights, per-rung caps and order.

    ``caps[i][j]``: the most rate units one worker running rung ``j`` can carry if client ``i`` is
    its lowest-budget member (-1: rung ``j`` cannot serve client ``i``); ``order[j]``: clients by
    budget for rung ``j``, descending (ties by position).
    """

    def __init__(self, snapshot: Snapshot) -> None:
        ladder, clients = snapshot.ladder, snapshot.clients
        self.clients = clients
        self.weights, self.unit = rate_units([c.fps for c in clients])
        self.accuracy = [float(a) for a in ladder.accuracy]
        prefix = np.maximum.accumulate(ladder.throughput_rps, axis=1)
        self.caps: list[list[int]] = []
        for c in clients:
            caps = []
            for j in range(ladder.size):
                b = c.max_batch(ladder, j)
                caps.append(math.floor(prefix[j, b - 1] / self.unit + 1e-9) if b >= 1 else -1)
            self.caps.append(caps)
        self.order: list[list[int]] = []
        for j in range(ladder.size):
            budgets = [-c.budget_ms[j] for c in clients]
            self.order.append(sorted(range(len(clients)), key=budgets.__getitem__))  # stable: by position
        self._eligible = [[i for i in self.order[j] if self.caps[i][j] >= 0] for j in range(ladder.size)]
        # prefix of rungs (most accurate first) -> (clients still unmapped as a bit mask, chosen groups)
        self._prefix: dict[tuple[int, ...], tuple[int, tuple[tuple[int, ...], ...]]] = {
            (): ((1 << len(clients)) - 1, ())
        }

    def best_subset(self, rung: int, remaining: int) -> tuple[int, ...]:
        """The subset of ``remaining`` (a bit mask) with the largest total rate one worker running
        ``rung`` can serve, as client positions."""
        rows = [i for i in self._eligible[rung] if (remaining >> i) & 1]
        reach = [1]
        for i in rows:
            r = reach[-1]
            reach.append(r | ((r << self.weights[i]) & ((1 << (self.caps[i][rung] + 1)) - 1)))
        total = reach[-1].bit_length() - 1
        chosen = []
        for n in range(len(rows) - 1, -1, -1):
            if (reach[n] >> total) & 1:
                continue  # reachable without this client: keep the earlier (higher-budget) clients
            chosen.append(rows[n])
            total -= self.weights[rows[n]]
        return tuple(sorted(chosen))

    def chosen(self, rungs: Sequence[int]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """Algorithm 1, MapClients: rungs most accurate first, and the client positions each serves.

        Greedy over rungs, so the mapping of a prefix of rungs never depends on what follows it:
        prefixes are memoised, and annealing neighbours that keep the large variants reuse them.
        """
        ordered = tuple(sorted(rungs, reverse=True))  # the ladder's accuracy grows with the rung
        n = len(ordered)
        while ordered[:n] not in self._prefix:
            n -= 1
        remaining, groups = self._prefix[ordered[:n]]
        for m in range(n, len(ordered)):
            picked = self.best_subset(ordered[m], remaining)
            for i in picked:
                remaining &= ~(1 << i)
            groups = (*groups, picked)
            self._prefix[ordered[: m + 1]] = (remaining, groups)
        return ordered, groups

    def map(self, rungs: Sequence[int]) -> Groups:
        """``(rung, clients)`` for each entry of ``rungs``, in the same order."""
        ordered, groups = self.chosen(rungs)
        pool: dict[int, list[tuple[int, ...]]] = {}
        for rung, group in zip(ordered, groups, strict=True):
            pool.setdefault(rung, []).append(group)
        return tuple((r, tuple(self.clients[i] for i in pool[r].pop(0))) for r in rungs)


def map_clients(snapshot: Snapshot, rungs: Sequence[int]) -> Groups:
    """Algorithm 1 on ``snapshot`` for workers running ``rungs``."""
    return Table(snapshot).map(rungs)


def place(current: Sequence[int], new: Sequence[int]) -> list[int]:
    """Section 4.4: ``new`` rungs given to workers holding ``current``, minimising total movement."""
    workers = sorted(range(len(current)), key=lambda k: (current[k], k))
    placed = [0] * len(current)
    for k, rung in zip(workers, sorted(new), strict=True):
        placed[k] = rung
    return placed
