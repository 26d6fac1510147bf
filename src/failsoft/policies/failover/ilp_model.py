"""The warm-backup ILP's data (:class:`Instance`) and its columns (:class:`Columns`), and exact solves.

An :class:`Instance` is what every stage of the proactive solve shares: the critical apps, the
variants each may use (eq. 6 and "never larger than the primary"), the servers' free capacity, which
server each app may not use (eq. 4) and the cluster budget (eq. 3). :class:`Columns` materialises the
full ILP's binaries, one per (app, variant, server) that could hold the backup on its own, either all
of them or a neighbourhood per app. :func:`solve_lexicographic` solves them with HiGHS.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.domain import App, Demand, PolicyParams, Scenario, Variant, WarmBackup
from failsoft.policies.failover.common import candidate_variants, warm_exclusions
from failsoft.policies.failover.ledger import Ledger
from failsoft.policies.failover.milp import INF, MilpResult, maximize

if TYPE_CHECKING:
    from scipy import sparse

_EPS = 1e-9


@dataclass
class Instance:
    """One warm-backup placement problem (FailLite 3.2)."""

    scenario: Scenario
    apps: list[App]
    app_variants: list[tuple[Variant, ...]]  # candidates per app, smallest first
    servers: list[str]
    free_memory: np.ndarray
    free_compute: np.ndarray
    excluded: np.ndarray  # apps x servers: eq. 4 (and site independence)
    budget: Demand  # eq. 3

    @property
    def params(self) -> PolicyParams:
        return self.scenario.policy

    @property
    def replicas(self) -> int:
        return self.params.warm_replicas

    @property
    def coverage_needed(self) -> int:
        return self.replicas * len(self.apps)

    def ledger(self) -> Ledger:
        return Ledger(
            {
                s: Demand(m, c)
                for s, m, c in zip(self.servers, self.free_memory, self.free_compute, strict=True)
            }
        )

    def demand(self, i: int, j: int) -> Demand:
        return self.app_variants[i][j].demand(self.apps[i].rate_rps)

    def value(self, i: int, j: int) -> float:
        """Eq. 1's term: normalised accuracy x request rate."""
        app = self.apps[i]
        return self.scenario.family(app.family).normalized_accuracy(self.app_variants[i][j]) * app.rate_rps

    def eligible(self, i: int, j: int) -> np.ndarray:
        """Servers that could hold variant ``j`` of app ``i`` on their own."""
        d = self.demand(i, j)
        if not d.fits_in(self.budget):
            return np.zeros(len(self.servers), dtype=bool)
        return (
            (d.memory_mb <= self.free_memory + _EPS)
            & (d.compute <= self.free_compute + _EPS)
            & ~self.excluded[i]
        )

    def pairs(self) -> list[tuple[int, int]]:
        return [(i, j) for i, variants in enumerate(self.app_variants) for j in range(len(variants))]

    def column_count(self) -> int:
        return sum(int(self.eligible(i, j).sum()) for i, j in self.pairs())

    def objective(self, backups: Sequence[WarmBackup]) -> float:
        index = {a.name: i for i, a in enumerate(self.apps)}
        total = 0.0
        for b in backups:
            i = index[b.app]
            j = next(j for j, v in enumerate(self.app_variants[i]) if v.name == b.variant)
            total += self.value(i, j)
        return total


def make_instance(scenario: Scenario, unavailable: Collection[str]) -> Instance:
    critical = [
        a
        for a in scenario.apps
        if a.critical and a.primary is not None and a.primary.server not in unavailable
    ]
    free = scenario.free(unavailable, include_warm=False)
    servers = list(free)
    free_memory = np.array([free[s].memory_mb for s in servers], dtype=float)
    free_compute = np.array([free[s].compute for s in servers], dtype=float)
    position = {s: k for k, s in enumerate(servers)}
    excluded = np.zeros((len(critical), len(servers)), dtype=bool)
    for i, app in enumerate(critical):
        excluded[i, [position[s] for s in warm_exclusions(scenario, app) if s in position]] = True
    budget = Demand(free_memory.sum(), free_compute.sum()).scaled(1.0 - scenario.policy.alpha)
    variants = [candidate_variants(scenario, a, strict_slo=True) for a in critical]
    return Instance(scenario, critical, variants, servers, free_memory, free_compute, excluded, budget)


@dataclass
class Columns:
    """The full ILP's binaries (or a subset of them) for an instance."""

    inst: Instance
    app: np.ndarray
    variant: np.ndarray  # index into inst.app_variants[app]
    server: np.ndarray
    memory: np.ndarray
    compute: np.ndarray
    value: np.ndarray

    @property
    def n(self) -> int:
        return len(self.app)

    def _keys(self, apps, variants, servers) -> np.ndarray:
        width = max(len(v) for v in self.inst.app_variants) + 1
        return (np.asarray(apps) * width + np.asarray(variants)) * len(self.inst.servers) + np.asarray(
            servers
        )

    def to_x(self, backups: Sequence[WarmBackup]) -> np.ndarray:
        """The 0-1 vector of a list of backups; backups outside these columns are dropped."""
        inst = self.inst
        app_pos = {a.name: i for i, a in enumerate(inst.apps)}
        server_pos = {s: k for k, s in enumerate(inst.servers)}
        triples = []
        for b in backups:
            i = app_pos[b.app]
            j = next(j for j, v in enumerate(inst.app_variants[i]) if v.name == b.variant)
            triples.append((i, j, server_pos[b.server]))
        wanted = self._keys(*zip(*triples, strict=True)) if triples else np.zeros(0, dtype=int)
        return np.isin(self._keys(self.app, self.variant, self.server), wanted).astype(float)

    def to_backups(self, x: np.ndarray) -> list[WarmBackup]:
        inst = self.inst
        return [
            WarmBackup(
                inst.apps[self.app[c]].name,
                inst.app_variants[self.app[c]][self.variant[c]].name,
                inst.servers[self.server[c]],
            )
            for c in np.flatnonzero(x > 0.5)
        ]


def build_columns(inst: Instance, allowed: np.ndarray | None = None) -> Columns:
    """Every (app, variant, server) column, or only those whose (app, server) is ``allowed``."""
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("app", "variant", "server", "memory", "compute", "value")
    }
    for i, j in inst.pairs():
        ok = inst.eligible(i, j)
        if allowed is not None:
            ok &= allowed[i]
        idx = np.flatnonzero(ok)
        d = inst.demand(i, j)
        for key, value in (
            ("app", i),
            ("variant", j),
            ("memory", d.memory_mb),
            ("compute", d.compute),
            ("value", inst.value(i, j)),
        ):
            parts[key].append(np.full(len(idx), value))
        parts["server"].append(idx)

    def cat(key: str, dtype: type) -> np.ndarray:
        return np.concatenate(parts[key]).astype(dtype) if parts[key] else np.zeros(0, dtype=dtype)

    return Columns(
        inst,
        cat("app", int),
        cat("variant", int),
        cat("server", int),
        cat("memory", float),
        cat("compute", float),
        cat("value", float),
    )


def full_matrix(
    cols: Columns, exact_coverage: bool, min_coverage: int | None = None
) -> tuple[sparse.csc_matrix, np.ndarray, np.ndarray]:
    """Rows of the full ILP: eqs. 2 (per server), 3 (budget), 5 (coverage), distinct servers."""
    inst = cols.inst
    n, n_servers, n_apps = cols.n, len(inst.servers), len(inst.apps)
    rows: list[np.ndarray] = []
    columns: list[np.ndarray] = []
    values: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []
    col = np.arange(n)

    def block(row_of_col: np.ndarray, vals: np.ndarray, lo, hi) -> None:
        rows.append(len(lower) + row_of_col)
        columns.append(col)
        values.append(vals)
        lower.extend(lo)
        upper.extend(hi)

    zeros, ones = np.zeros(n, dtype=int), np.ones(n)
    block(cols.server, cols.memory, np.full(n_servers, -INF), inst.free_memory)
    block(cols.server, cols.compute, np.full(n_servers, -INF), inst.free_compute)
    block(zeros, cols.memory, [-INF], [inst.budget.memory_mb])
    block(zeros, cols.compute, [-INF], [inst.budget.compute])
    r = inst.replicas
    block(cols.app, ones, np.full(n_apps, r if exact_coverage else 0), np.full(n_apps, r))
    if r > 1:
        uniq, pair_row = np.unique(cols.app * n_servers + cols.server, return_inverse=True)
        block(pair_row, ones, np.zeros(len(uniq)), np.ones(len(uniq)))
    if min_coverage is not None:
        block(zeros, ones, [min_coverage], [INF])
    from scipy import sparse  # here: agents import this module, never solve

    matrix = sparse.csc_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))), shape=(len(lower), n)
    )
    return matrix, np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)


def solve_lexicographic(cols: Columns, start: np.ndarray, deadline: float) -> MilpResult:
    """Most backups first, then the accuracy objective (eq. 5 as an equality where it can hold)."""
    params = cols.inst.params
    options: dict[str, Any] = {"mip_rel_gap": params.ilp_mip_gap, "seed": params.seed}
    upper = np.ones(cols.n)
    if round(start.sum()) == cols.inst.coverage_needed:
        return maximize(
            cols.value,
            *full_matrix(cols, exact_coverage=True),
            upper,
            time_limit_s=seconds_left(deadline),
            start=start,
            **options,
        )
    cover = maximize(
        np.ones(cols.n),
        *full_matrix(cols, exact_coverage=False),
        upper,
        time_limit_s=seconds_left(deadline) / 2,
        start=start,
        **options,
    )
    best = maximize(
        cols.value,
        *full_matrix(cols, False, round(cover.x.sum())),
        upper,
        time_limit_s=seconds_left(deadline),
        start=cover.x,
        **options,
    )
    return MilpResult(best.x, best.objective, best.dual_bound, best.optimal and cover.optimal, best.feasible)


def seconds_left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.05)
