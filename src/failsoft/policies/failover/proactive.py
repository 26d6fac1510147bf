"""Proactive failover: FailLite's warm-backup selection and placement ILP (section 3.2, eqs. 1-7).

Central idea: for each critical app pick a variant and a server for its warm backup(s) so that the
sum of *normalised accuracy x request rate* is largest, subject to

* (2) every server's free memory and compute hold the backups placed on it;
* (3) backups take at most ``(1 - alpha)`` of the cluster's free capacity in each resource, the rest
  being reserved for cold (progressive) failover;
* (4) a backup never shares its primary's server (with ``site_independent``: never its site, 3.4);
* (5) each critical app gets ``warm_replicas`` backups on distinct servers (3.4's multi-replica form);
* (6) only variants whose latency meets the app's SLO, and never larger than the primary;
* (7) binary choices.

Equation 5 is an equality in the paper. When it cannot hold for every app, failsoft solves the
problem lexicographically: first the largest number of backups that can be placed, then the
accuracy objective under that coverage; the apps left short are reported in ``unplaced``. Both
stages run on HiGHS (through ``highspy``), warm-started from a greedy placement, under the
configured time limit and relative MIP gap.

Large instances (hundreds of apps on a hundred servers give ~10^5 binaries, whose root LP alone
outlasts the time limit) are solved by decomposition, with an honest bound:

1. the *aggregated* ILP chooses variants only (one integer per app and variant, eqs. 1, 3, 5, 6, and
   total capacity); its optimum bounds the full ILP's from above, since every full solution is one;
2. the chosen variants are packed worst-fit-decreasing (eqs. 2, 4, distinct servers), an item that
   does not fit trying smaller variants, then every backup is upgraded as far as its server and the
   budget allow;
3. the full ILP restricted to a neighbourhood of servers per app improves that packing with HiGHS.

The reported ``mip_gap`` is measured against the bound of step 1, so it is a true optimality gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from failsoft.domain import App, Demand, ProactivePlan, Scenario, Variant, WarmBackup
from failsoft.policies.failover.common import candidate_variants, warm_exclusions
from failsoft.policies.failover.interface import elapsed_ms
from failsoft.policies.failover.ledger import Ledger
from failsoft.policies.failover.milp import INF, MilpResult, maximize

_EPS = 1e-9
# Above this many (app, variant, server) columns the full ILP is solved by decomposition.
FULL_MODEL_MAX_COLUMNS = 20_000
# Servers per app in the restricted improvement ILP of a decomposed solve.
NEIGHBOURHOOD_SERVERS = 12


# ----------------------------------------------------------------------------------------------
# Greedy placement: the ILP's incumbent, and the full-size baselines' whole strategy.
# ----------------------------------------------------------------------------------------------


def place_warm_greedy(
    scenario: Scenario,
    apps: Sequence[App],
    preferences: Callable[[App], Sequence[Variant]],
    ledger: Ledger,
    budget: Demand | None,
    replicas: int,
) -> tuple[list[WarmBackup], list[str]]:
    """Place ``replicas`` warm backups per app worst-fit, trying ``preferences(app)`` in order.

    Takes what it places from ``ledger`` and ``budget`` (``None``: no cluster-wide budget).
    Returns the backups and the apps left with fewer than ``replicas``.
    """
    backups: list[WarmBackup] = []
    short: list[str] = []
    remaining = budget
    for app in apps:
        excluded = warm_exclusions(scenario, app)
        got = 0
        for _ in range(replicas):
            for variant in preferences(app):
                demand = variant.demand(app.rate_rps)
                if remaining is not None and not demand.fits_in(remaining):
                    continue
                server = ledger.worst_fit(demand, exclude=excluded)
                if server is None:
                    continue
                ledger.take(server, demand)
                if remaining is not None:
                    remaining = remaining - demand
                excluded.add(server)
                backups.append(WarmBackup(app.name, variant.name, server))
                got += 1
                break
        if got < replicas:
            short.append(app.name)
    return backups, short


# ----------------------------------------------------------------------------------------------
# The ILP.
# ----------------------------------------------------------------------------------------------


@dataclass
class _Model:
    """Columns of the full ILP: one per (app, variant, server) that could hold a backup on its own."""

    apps: list[App]
    app_variants: list[tuple[Variant, ...]]  # candidate variants per app, smallest first
    servers: list[str]
    col_app: np.ndarray
    col_variant: np.ndarray  # index into app_variants[col_app]
    col_server: np.ndarray
    col_memory: np.ndarray
    col_compute: np.ndarray
    col_value: np.ndarray  # normalised accuracy x request rate (eq. 1)
    free_memory: np.ndarray
    free_compute: np.ndarray
    budget: Demand
    replicas: int

    @property
    def n(self) -> int:
        return len(self.col_app)

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

    def column_keys(self) -> np.ndarray:
        width = max(len(v) for v in self.app_variants) + 1
        return (self.col_app * width + self.col_variant) * len(self.servers) + self.col_server

    def to_x(self, backups: Sequence[WarmBackup]) -> np.ndarray:
        """The column vector of a list of backups (each must be a column of the model)."""
        width = max(len(v) for v in self.app_variants) + 1
        app_pos = {a.name: i for i, a in enumerate(self.apps)}
        server_pos = {s: k for k, s in enumerate(self.servers)}
        keys = []
        for b in backups:
            i = app_pos[b.app]
            j = next(j for j, v in enumerate(self.app_variants[i]) if v.name == b.variant)
            keys.append((i * width + j) * len(self.servers) + server_pos[b.server])
        return np.isin(self.column_keys(), keys).astype(float)

    def to_backups(self, x: np.ndarray) -> list[WarmBackup]:
        return [
            WarmBackup(
                self.apps[self.col_app[c]].name,
                self.app_variants[self.col_app[c]][self.col_variant[c]].name,
                self.servers[self.col_server[c]],
            )
            for c in np.flatnonzero(x > 0.5)
        ]


def plan_warm_ilp(
    scenario: Scenario, policy_name: str = "faillite", unavailable: Collection[str] = ()
) -> ProactivePlan:
    """Warm backups for the scenario's critical apps, as FailLite's ILP chooses them."""
    started = time.perf_counter()
    params = scenario.policy
    critical = [
        a
        for a in scenario.apps
        if a.critical and a.primary is not None and a.primary.server not in unavailable
    ]
    if params.warm_replicas == 0 or not critical:
        return ProactivePlan(policy_name, (), (), 0.0, elapsed_ms(started), 0.0, True)
    model = _build_model(scenario, critical, unavailable)
    deadline = started + params.ilp_time_limit_s
    if model.n == 0:
        x, gap, optimal = np.zeros(0), 0.0, True
    elif model.n <= FULL_MODEL_MAX_COLUMNS:
        x, gap, optimal = _solve_full(scenario, model, deadline)
    else:
        x, gap, optimal = _solve_decomposed(scenario, model, deadline)
    chosen = np.flatnonzero(x > 0.5)
    counts = np.bincount(model.col_app[chosen], minlength=len(critical))
    unplaced = tuple(a.name for i, a in enumerate(critical) if counts[i] < model.replicas)
    objective = float(model.col_value[chosen].sum())
    return ProactivePlan(
        policy_name, tuple(model.to_backups(x)), unplaced, objective, elapsed_ms(started), gap, optimal
    )


def _build_model(scenario: Scenario, critical: list[App], unavailable: Collection[str]) -> _Model:
    free = scenario.free(unavailable, include_warm=False)
    servers = list(free)
    free_memory = np.array([free[s].memory_mb for s in servers])
    free_compute = np.array([free[s].compute for s in servers])
    budget = Demand(free_memory.sum(), free_compute.sum()).scaled(1.0 - scenario.policy.alpha)
    position = {s: i for i, s in enumerate(servers)}
    app_variants = [candidate_variants(scenario, a, strict_slo=True) for a in critical]
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("app", "variant", "server", "memory", "compute", "value")
    }
    for ai, app in enumerate(critical):
        excluded = np.zeros(len(servers), dtype=bool)
        excluded[[position[s] for s in warm_exclusions(scenario, app) if s in position]] = True
        family = scenario.family(app.family)
        for vj, variant in enumerate(app_variants[ai]):
            d = variant.demand(app.rate_rps)
            if not d.fits_in(budget):
                continue
            ok = (d.memory_mb <= free_memory + _EPS) & (d.compute <= free_compute + _EPS) & ~excluded
            idx = np.flatnonzero(ok)
            for key, value in (
                ("app", ai),
                ("variant", vj),
                ("memory", d.memory_mb),
                ("compute", d.compute),
                ("value", family.normalized_accuracy(variant) * app.rate_rps),
            ):
                parts[key].append(np.full(len(idx), value))
            parts["server"].append(idx)

    def cat(key: str, dtype: type) -> np.ndarray:
        return np.concatenate(parts[key]).astype(dtype) if parts[key] else np.zeros(0, dtype=dtype)

    return _Model(
        critical,
        app_variants,
        servers,
        cat("app", int),
        cat("variant", int),
        cat("server", int),
        cat("memory", float),
        cat("compute", float),
        cat("value", float),
        free_memory,
        free_compute,
        budget,
        scenario.policy.warm_replicas,
    )


# ----------------------------------------------------------------------------------------------
# Heuristic solutions: the greedy start, packing of chosen variants, and the upgrade pass.
# ----------------------------------------------------------------------------------------------


def _greedy(scenario: Scenario, model: _Model) -> list[WarmBackup]:
    """A feasible start: smallest variants worst-fit (most valuable apps first), then upgraded."""
    ledger = model.ledger()
    order = sorted(model.apps, key=lambda a: (-a.rate_rps, a.name))
    variants = {a.name: v for a, v in zip(model.apps, model.app_variants, strict=True)}
    backups, _ = place_warm_greedy(
        scenario, order, lambda a: variants[a.name], ledger, model.budget, model.replicas
    )
    return _upgrade(scenario, model, backups, ledger)


def _pack(scenario: Scenario, model: _Model, targets: list[list[int]]) -> list[WarmBackup]:
    """Worst-fit-decreasing packing of the chosen variants; a misfit tries smaller ones."""
    ledger = model.ledger()
    remaining = model.budget
    items = [(i, j) for i, js in enumerate(targets) for j in js]
    items.sort(key=lambda ij: (-model.app_variants[ij[0]][ij[1]].memory_mb, ij))
    used: dict[int, set[str]] = {}
    backups = []
    for i, j in items:
        app = model.apps[i]
        excluded = warm_exclusions(scenario, app) | used.setdefault(i, set())
        for variant in reversed(model.app_variants[i][: j + 1]):
            d = variant.demand(app.rate_rps)
            server = ledger.worst_fit(d, exclude=excluded) if d.fits_in(remaining) else None
            if server is not None:
                ledger.take(server, d)
                remaining = remaining - d
                used[i].add(server)
                backups.append(WarmBackup(app.name, variant.name, server))
                break
    return _upgrade(scenario, model, backups, ledger)


def _upgrade(
    scenario: Scenario, model: _Model, backups: list[WarmBackup], ledger: Ledger
) -> list[WarmBackup]:
    """Each backup grows to the largest variant its server and the budget still allow."""
    variants = {a.name: (a, v) for a, v in zip(model.apps, model.app_variants, strict=True)}
    spent = Demand()
    for b in backups:
        app, _ = variants[b.app]
        spent += scenario.variant_of(app, b.variant).demand(app.rate_rps)
    upgraded = []
    for b in sorted(backups, key=lambda b: (-variants[b.app][0].rate_rps, b.app, b.server)):
        app, candidates = variants[b.app]
        current = scenario.variant_of(app, b.variant).demand(app.rate_rps)
        ledger.give(b.server, current)
        spent -= current
        best = b.variant
        for v in reversed(candidates):
            d = v.demand(app.rate_rps)
            if ledger.fits(b.server, d) and (spent + d).fits_in(model.budget):
                best = v.name
                break
        d = scenario.variant_of(app, best).demand(app.rate_rps)
        ledger.take(b.server, d)
        spent += d
        upgraded.append(WarmBackup(b.app, best, b.server))
    return upgraded


# ----------------------------------------------------------------------------------------------
# Exact solves.
# ----------------------------------------------------------------------------------------------


def _full_matrix(
    model: _Model, exact_coverage: bool, min_coverage: int | None = None
) -> tuple[sparse.csc_matrix, np.ndarray, np.ndarray]:
    """Rows of the full ILP: eqs. 2 (per server), 3 (budget), 5 (coverage), distinct servers."""
    n, n_servers, n_apps = model.n, len(model.servers), len(model.apps)
    rows, cols, vals, lower, upper = [], [], [], [], []
    columns = np.arange(n)

    def block(row_of_col: np.ndarray, values: np.ndarray, lo, hi) -> None:
        rows.append(len(lower) + row_of_col)
        cols.append(columns)
        vals.append(values)
        lower.extend(lo)
        upper.extend(hi)

    zeros, ones = np.zeros(n, dtype=int), np.ones(n)
    block(model.col_server, model.col_memory, np.full(n_servers, -INF), model.free_memory)
    block(model.col_server, model.col_compute, np.full(n_servers, -INF), model.free_compute)
    block(zeros, model.col_memory, [-INF], [model.budget.memory_mb])
    block(zeros, model.col_compute, [-INF], [model.budget.compute])
    r = model.replicas
    block(model.col_app, ones, np.full(n_apps, r if exact_coverage else 0), np.full(n_apps, r))
    if r > 1:
        uniq, pair_row = np.unique(model.col_app * n_servers + model.col_server, return_inverse=True)
        block(pair_row, ones, np.zeros(len(uniq)), np.ones(len(uniq)))
    if min_coverage is not None:
        block(zeros, ones, [min_coverage], [INF])
    matrix = sparse.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(lower), n)
    )
    return matrix, np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)


def _solve_lexicographic(
    model: _Model, start: np.ndarray, deadline: float, params, presolve: bool = True
) -> MilpResult:
    """Most backups first, then the accuracy objective (eq. 5 as an equality where it can hold)."""
    options = {"mip_rel_gap": params.ilp_mip_gap, "seed": params.seed, "presolve": presolve}
    upper = np.ones(model.n)
    if round(start.sum()) == model.coverage_needed:
        return maximize(
            model.col_value,
            *_full_matrix(model, exact_coverage=True),
            upper,
            time_limit_s=_left(deadline),
            start=start,
            **options,
        )
    cover = maximize(
        np.ones(model.n),
        *_full_matrix(model, exact_coverage=False),
        upper,
        time_limit_s=_left(deadline) / 2,
        start=start,
        **options,
    )
    best = maximize(
        model.col_value,
        *_full_matrix(model, False, round(cover.x.sum())),
        upper,
        time_limit_s=_left(deadline),
        start=cover.x,
        **options,
    )
    return MilpResult(best.x, best.objective, best.dual_bound, best.optimal and cover.optimal, best.feasible)


def _solve_full(scenario: Scenario, model: _Model, deadline: float) -> tuple[np.ndarray, float | None, bool]:
    result = _solve_lexicographic(model, model.to_x(_greedy(scenario, model)), deadline, scenario.policy)
    return result.x, result.gap, result.optimal


def _solve_aggregated(
    model: _Model, exact_coverage: bool, deadline: float, params
) -> tuple[list[list[int]], float]:
    """Variant choice only (step 1): the targets per app, and an upper bound on the full optimum."""
    pair = model.col_app * (max(len(v) for v in model.app_variants) + 1) + model.col_variant
    uniq, first = np.unique(pair, return_index=True)
    n = len(uniq)
    agg_app, agg_variant = model.col_app[first], model.col_variant[first]
    cost, memory, compute = model.col_value[first], model.col_memory[first], model.col_compute[first]
    r = model.replicas
    eligible = np.array(
        [len(np.unique(model.col_server[model.col_app == i])) for i in range(len(model.apps))]
    )
    n_apps = len(model.apps)
    rows = np.concatenate([agg_app, np.full(n, n_apps), np.full(n, n_apps + 1)])
    cols = np.concatenate([np.arange(n)] * 3)
    vals = np.concatenate([np.ones(n), memory, compute])
    matrix = sparse.csc_matrix((vals, (rows, cols)), shape=(n_apps + 2, n))
    cover = np.minimum(eligible, r).astype(float)
    lower = np.concatenate([cover if exact_coverage else np.zeros(n_apps), [-INF, -INF]])
    upper = np.concatenate([cover, [model.budget.memory_mb, model.budget.compute]])
    result = maximize(
        cost,
        matrix,
        lower,
        upper,
        np.full(n, float(r)),
        time_limit_s=_left(deadline),
        mip_rel_gap=params.ilp_mip_gap / 4,
        seed=params.seed,
    )
    if not result.feasible and exact_coverage:
        return _solve_aggregated(model, False, deadline, params)
    targets: list[list[int]] = [[] for _ in model.apps]
    for c in np.flatnonzero(result.x > 0.5):
        targets[agg_app[c]].extend([int(agg_variant[c])] * round(result.x[c]))
    return targets, result.dual_bound


def _solve_decomposed(
    scenario: Scenario, model: _Model, deadline: float
) -> tuple[np.ndarray, float | None, bool]:
    params = scenario.policy
    greedy = model.to_x(_greedy(scenario, model))
    targets, _ = _solve_aggregated(model, True, time.perf_counter() + _left(deadline) * 0.25, params)
    packed = model.to_x(_pack(scenario, model, targets))
    x = max((greedy, packed), key=lambda v: (round(v.sum()), float(model.col_value @ v)))
    # The bound must hold for the coverage reached: with every app covered, the exact aggregate
    # bounds it; otherwise only the relaxed (<=) aggregate does.
    full_cover = round(x.sum()) == model.coverage_needed
    _, bound = _solve_aggregated(model, full_cover, time.perf_counter() + _left(deadline) * 0.25, params)
    if _gap(model, x, bound) > params.ilp_mip_gap and _left(deadline) > 0.2:
        mask = _neighbourhood(model, x, params.seed)
        sub = _restrict(model, mask)
        improved = _solve_lexicographic(sub, x[mask], deadline, params)
        if (round(improved.x.sum()), improved.objective) >= (round(x.sum()), float(model.col_value @ x)):
            x = np.zeros(model.n)
            x[mask] = improved.x
    gap = _gap(model, x, bound)
    return x, gap, gap <= params.ilp_mip_gap


def _neighbourhood(model: _Model, x: np.ndarray, seed: int) -> np.ndarray:
    """Columns kept in the restricted ILP: per app, its current servers, the servers with the most
    free memory left, and a few random ones."""
    rng = np.random.default_rng(seed)
    n_apps, n_servers = len(model.apps), len(model.servers)
    taken = np.bincount(model.col_server, weights=model.col_memory * x, minlength=n_servers)
    roomiest = np.argsort(-(model.free_memory - taken), kind="stable")[:NEIGHBOURHOOD_SERVERS]
    allowed = np.zeros((n_apps, n_servers), dtype=bool)
    allowed[:, roomiest] = True
    chosen = np.flatnonzero(x > 0.5)
    allowed[model.col_app[chosen], model.col_server[chosen]] = True
    extra = rng.integers(0, n_servers, size=(n_apps, NEIGHBOURHOOD_SERVERS))
    allowed[np.repeat(np.arange(n_apps), NEIGHBOURHOOD_SERVERS), extra.ravel()] = True
    return allowed[model.col_app, model.col_server]


def _restrict(model: _Model, mask: np.ndarray) -> _Model:
    return _Model(
        model.apps,
        model.app_variants,
        model.servers,
        model.col_app[mask],
        model.col_variant[mask],
        model.col_server[mask],
        model.col_memory[mask],
        model.col_compute[mask],
        model.col_value[mask],
        model.free_memory,
        model.free_compute,
        model.budget,
        model.replicas,
    )


def _gap(model: _Model, x: np.ndarray, bound: float) -> float:
    value = float(model.col_value @ x)
    if not np.isfinite(bound):
        return INF
    return max(bound - value, 0.0) / value if value > 0 else (0.0 if bound <= 1e-9 else INF)


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.05)
