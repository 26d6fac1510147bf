"""The exact MILP of mapping + selection (Jellyfish section 4.1, problem P1), solved with HiGHS.

It is the yardstick for the heuristic, not a policy to run every half second. Variables:

* ``z[k, j, b]`` (binary): worker ``k`` runs rung ``j`` at batch ``b``; at most one per worker (eq. 4).
* ``x[i, k, j]`` (binary): client ``i`` is served by worker ``k`` running rung ``j``; created only where
  ``2 l_j(1) <= L_ij``; at most one per client (eq. 3, ``<= 1``: a client may stay unserved).

Constraints: ``x[i, k, j] <= sum of z[k, j, b] over the batches b with 2 l_j(b) <= L_ij`` (eqs. 5-6:
the client's worker runs its rung at a batch that fits its budget) and, per worker and rung, the
mapped rate ``sum fps_i x[i, k, j] <= sum t_j(b) z[k, j, b]`` (eq. 7). Workers are interchangeable,
so their configurations are ordered (worker k's configuration index >= worker k+1's), which removes
the K! symmetric copies of every solution without cutting any.

The objective is lexicographic like the heuristic's: first the served rate (O1), then, with that
rate fixed, ``sum a_j fps_i x[i, k, j]`` (eq. 2). Each stage gets half the time limit; when a stage
stops at the limit, the result says so and carries HiGHS's gap (``mip_gap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from failsoft.policies.adaptation.interface import AdaptationPolicy
from failsoft.policies.adaptation.model import ClientSnapshot, Plan, Snapshot, evaluate
from failsoft.policies.failover.milp import INF, MilpResult, maximize

if TYPE_CHECKING:
    from scipy import sparse

MIP_REL_GAP = 1e-6


@dataclass
class _Model:
    x_index: list[tuple[int, int, int]]  # column -> (client, worker, rung); z columns follow
    z_index: list[tuple[int, int, int]]  # (worker, rung, batch)
    matrix: sparse.csr_matrix
    lower: np.ndarray
    upper: np.ndarray
    served: np.ndarray  # objective of stage 1 (fps per x column)
    value: np.ndarray  # objective of stage 2 (a_j fps per x column)


def _build(snapshot: Snapshot) -> _Model:
    ladder, clients, n_k = snapshot.ladder, snapshot.clients, len(snapshot.workers)
    m, n_b = ladder.size, ladder.max_batch
    z_index = [(k, j, b) for k in range(n_k) for j in range(m) for b in range(1, n_b + 1)]
    x_index = [
        (i, k, j)
        for i, c in enumerate(clients)
        for k in range(n_k)
        for j in range(m)
        if c.max_batch(ladder, j) >= 1
    ]
    nx = len(x_index)
    zcol = {key: nx + n for n, key in enumerate(z_index)}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    upper: list[float] = []

    def row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(lower)
        for col, v in entries:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        lower.append(lo)
        upper.append(hi)

    by_client: dict[int, list[int]] = {}
    by_worker_rung: dict[tuple[int, int], list[int]] = {}
    for n, (i, k, j) in enumerate(x_index):
        by_client.setdefault(i, []).append(n)
        by_worker_rung.setdefault((k, j), []).append(n)
        bmax = clients[i].max_batch(ladder, j)
        row([(n, 1.0)] + [(zcol[k, j, b], -1.0) for b in range(1, bmax + 1)], -INF, 0.0)  # eqs. 5-6
    for cols_i in by_client.values():
        row([(n, 1.0) for n in cols_i], -INF, 1.0)  # eq. 3
    for k in range(n_k):
        row([(zcol[k, j, b], 1.0) for j in range(m) for b in range(1, n_b + 1)], -INF, 1.0)  # eq. 4
        for j in range(m):
            entries = [(n, clients[x_index[n][0]].fps) for n in by_worker_rung.get((k, j), [])]
            entries += [(zcol[k, j, b], -float(ladder.throughput_rps[j, b - 1])) for b in range(1, n_b + 1)]
            row(entries, -INF, 0.0)  # eq. 7
        if k + 1 < n_k:  # symmetry: configuration index non-increasing over workers
            entries = [(zcol[k, j, b], float(j * n_b + b)) for j in range(m) for b in range(1, n_b + 1)]
            entries += [(zcol[k + 1, j, b], -float(j * n_b + b)) for j in range(m) for b in range(1, n_b + 1)]
            row(entries, 0.0, INF)
    n_cols = nx + len(z_index)
    from scipy import sparse  # here: agents import this module, never solve

    matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(len(lower), n_cols))
    fps = np.array([clients[i].fps for i, _, _ in x_index])
    acc = ladder.accuracy
    served = np.concatenate([fps, np.zeros(len(z_index))])
    value = np.concatenate([fps * np.array([acc[j] for _, _, j in x_index]), np.zeros(len(z_index))])
    return _Model(x_index, z_index, matrix, np.array(lower), np.array(upper), served, value)


def solve(
    snapshot: Snapshot, time_limit_s: float = 10.0, seed: int = 0, start: Plan | None = None
) -> tuple[Plan, MilpResult]:
    """The optimum (or the best found within ``time_limit_s``) as a plan, and the second stage's result.

    ``start`` (a feasible plan, e.g. the heuristic's) is handed to HiGHS as its first incumbent: it
    only speeds the search; a proven optimum does not depend on it. Without a proof, the result's
    ``dual_bound`` bounds the optimum from above.
    """
    model = _build(snapshot)
    ones = np.ones(len(model.served))
    x0 = _columns(snapshot, model, start) if start is not None else None
    first = maximize(
        model.served, model.matrix, model.lower, model.upper, ones,
        time_limit_s=time_limit_s / 2, mip_rel_gap=MIP_REL_GAP, seed=seed, start=x0,
    )  # fmt: skip
    from scipy import sparse  # here: agents import this module, never solve

    matrix = sparse.vstack([model.matrix, sparse.csr_matrix(model.served)])
    lower = np.append(model.lower, first.objective - 1e-6)
    upper = np.append(model.upper, INF)
    second = maximize(
        model.value,
        matrix,
        lower,
        upper,
        ones,
        time_limit_s=time_limit_s / 2,
        mip_rel_gap=MIP_REL_GAP,
        seed=seed,
        start=first.x,
    )
    plan = _plan(snapshot, model, second.x, first, second)
    return plan, second


def _columns(snapshot: Snapshot, model: _Model, plan: Plan) -> np.ndarray:
    """``plan`` as a point of the model (workers in the symmetry order the model demands)."""
    ladder = snapshot.ladder
    client_index = {c.name: i for i, c in enumerate(snapshot.clients)}
    configs = sorted(
        ((w.rung * ladder.max_batch + w.batch if w.batch else 0, w) for w in plan.workers),
        key=lambda cw: -cw[0],
    )
    x = np.zeros(len(model.x_index) + len(model.z_index))
    x_col = {key: n for n, key in enumerate(model.x_index)}
    z_col = {key: len(model.x_index) + n for n, key in enumerate(model.z_index)}
    for k, (_, w) in enumerate(configs):
        if not w.batch:
            continue
        x[z_col[k, w.rung, w.batch]] = 1.0
        for name in w.clients:
            x[x_col[client_index[name], k, w.rung]] = 1.0
    return x


def _plan(snapshot: Snapshot, model: _Model, x: np.ndarray, first: MilpResult, second: MilpResult) -> Plan:
    n_k = len(snapshot.workers)
    rungs = [0] * n_k
    nx = len(model.x_index)
    for n, (k, j, _) in enumerate(model.z_index):
        if x[nx + n] > 0.5:
            rungs[k] = j
    groups: list[list[ClientSnapshot]] = [[] for _ in range(n_k)]
    for n, (i, k, _) in enumerate(model.x_index):
        if x[n] > 0.5:
            groups[k].append(snapshot.clients[i])
    optimal = first.optimal and second.optimal
    gaps = [g for g in (first.gap, second.gap) if g is not None]
    return evaluate(
        snapshot,
        "milp",
        [(rungs[k], tuple(groups[k])) for k in range(n_k)],
        optimal="yes" if optimal else "no",
        mip_gap=max(gaps) if gaps and not optimal else 0.0,
        columns=float(len(x)),
    )


class MilpPolicy(AdaptationPolicy):
    """The exact MILP as a policy (for benchmarks and small deployments), with a time limit."""

    name = "milp"

    def __init__(self, time_limit_s: float = 10.0, seed: int = 0) -> None:
        self.time_limit_s, self.seed = time_limit_s, seed

    def plan(self, snapshot: Snapshot) -> Plan:
        if not snapshot.workers or not snapshot.clients:
            return evaluate(snapshot, self.name, [(r, ()) for r in snapshot.start])
        return solve(snapshot, self.time_limit_s, self.seed)[0]
