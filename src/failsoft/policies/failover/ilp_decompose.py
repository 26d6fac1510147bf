"""Large warm-backup ILPs by decomposition, with a proven bound (FailLite 3.2 at 10^5+ binaries).

Central idea: the full ILP's difficulty is the server index; the accuracy trade-off is in the
variant choice. So

1. an *aggregated* ILP chooses variants only (one integer per app and variant; eqs. 1, 3, 5, 6). Any
   full solution is one of its solutions, so its optimum is an upper bound on the full optimum;
2. the chosen variants are packed in decreasing size (eqs. 2, 4, distinct servers), once by memory
   worst-fit and once balancing memory and compute, a misfit trying smaller variants; the smallest
   variants are packed the same ways (most coverage); every backup is then upgraded as far as its
   server and the budget allow; the best of these and of the greedy start is kept;
3. the full ILP restricted to a neighbourhood of servers per app (where each backup is, the roomiest
   servers, a few random ones) improves the best packing with HiGHS until the deadline.

The gap reported is the best solution's distance to the bound of step 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from failsoft.domain import App, Demand, Variant, WarmBackup
from failsoft.policies.failover.ilp_model import Instance, build_columns, seconds_left, solve_lexicographic
from failsoft.policies.failover.ledger import Ledger
from failsoft.policies.failover.milp import INF, maximize
from failsoft.policies.failover.warm_greedy import place_warm_greedy

# Columns of the restricted improvement ILP (step 3), all apps together.
RESTRICTED_COLUMNS = 40_000
_EPS = 1e-9


def solve_decomposed(inst: Instance, deadline: float) -> tuple[list[WarmBackup], float | None, bool]:
    params = inst.params
    step = seconds_left(deadline) * 0.25
    targets, _ = solve_aggregated(inst, True, time.perf_counter() + step)
    smallest = [[0] * inst.replicas for _ in inst.apps]  # most coverage; upgraded after packing
    candidates = [greedy(inst)] + [pack(inst, t, b) for t in (targets, smallest) for b in (True, False)]
    best = max(candidates, key=lambda b: (len(b), inst.objective(b)))
    # The bound must hold for the coverage reached: with every app covered, the exact aggregate
    # bounds it; otherwise only the relaxed (<=) aggregate does.
    full_cover = len(best) == inst.coverage_needed
    _, bound = solve_aggregated(inst, full_cover, time.perf_counter() + step)
    if _gap(inst.objective(best), bound) > params.ilp_mip_gap and seconds_left(deadline) > 0.2:
        per_app = int(np.clip(RESTRICTED_COLUMNS // max(len(inst.pairs()), 1) // 2, 2, 12))
        cols = build_columns(inst, neighbourhood(inst, best, per_app))
        start = cols.to_x(best)
        improved = solve_lexicographic(cols, start, deadline)
        if (round(improved.x.sum()), improved.objective) >= (len(best), inst.objective(best)):
            best = cols.to_backups(improved.x)
    gap = _gap(inst.objective(best), bound)
    return best, gap, gap <= params.ilp_mip_gap


def greedy(inst: Instance) -> list[WarmBackup]:
    """A feasible start: smallest variants worst-fit (most valuable apps first), then upgraded."""
    ledger = inst.ledger()
    order = sorted(inst.apps, key=lambda a: (-a.rate_rps, a.name))
    variants = {a.name: v for a, v in zip(inst.apps, inst.app_variants, strict=True)}
    backups, _ = place_warm_greedy(
        inst.scenario, order, lambda a: variants[a.name], ledger, inst.budget, inst.replicas
    )
    return upgrade(inst, backups, ledger)


def pack(inst: Instance, targets: list[list[int]], balanced: bool) -> list[WarmBackup]:
    """Decreasing packing of the chosen variants, a misfit trying smaller variants.

    ``balanced``: by dominant resource share, onto the server whose scarcer resource stays most free
    (memory and compute both bind near the budget); otherwise by memory, worst-fit (FailLite's rule).
    """
    mem_scale = max(float(inst.free_memory.mean()), _EPS)
    cpu_scale = max(float(inst.free_compute.mean()), _EPS)
    free_mem, free_cpu = inst.free_memory.copy(), inst.free_compute.copy()
    available = ~inst.excluded
    remaining = inst.budget

    def share(ij: tuple[int, int]) -> float:
        d = inst.demand(*ij)
        return max(d.memory_mb / mem_scale, d.compute / cpu_scale) if balanced else d.memory_mb

    items = sorted(((i, j) for i, js in enumerate(targets) for j in js), key=lambda ij: (-share(ij), ij))
    backups = []
    for i, j in items:
        app = inst.apps[i]
        for variant in reversed(inst.app_variants[i][: j + 1]):
            d = variant.demand(app.rate_rps)
            if not d.fits_in(remaining):
                continue
            mem_left, cpu_left = free_mem - d.memory_mb, free_cpu - d.compute
            slack = np.minimum(mem_left / mem_scale, cpu_left / cpu_scale) if balanced else mem_left.copy()
            slack[~available[i] | (mem_left < -_EPS) | (cpu_left < -_EPS)] = -np.inf
            k = int(np.argmax(slack))
            if not np.isfinite(slack[k]):
                continue
            free_mem[k] -= d.memory_mb
            free_cpu[k] -= d.compute
            remaining = remaining - d
            available[i, k] = False
            backups.append(WarmBackup(app.name, variant.name, inst.servers[k]))
            break
    ledger = Ledger({s: Demand(m, c) for s, m, c in zip(inst.servers, free_mem, free_cpu, strict=True)})
    return upgrade(inst, backups, ledger)


def upgrade(inst: Instance, backups: list[WarmBackup], ledger: Ledger) -> list[WarmBackup]:
    """Each backup grows to the largest variant its server and the budget still allow."""
    info: dict[str, tuple[App, tuple[Variant, ...]]] = {
        a.name: (a, v) for a, v in zip(inst.apps, inst.app_variants, strict=True)
    }

    def demand(b: WarmBackup) -> Demand:
        app, variants = info[b.app]
        return next(v for v in variants if v.name == b.variant).demand(app.rate_rps)

    spent = Demand()
    for b in backups:
        spent += demand(b)
    upgraded = []
    for b in sorted(backups, key=lambda b: (-info[b.app][0].rate_rps, b.app, b.server)):
        app, variants = info[b.app]
        current = demand(b)
        ledger.give(b.server, current)
        spent -= current
        best = next(
            v
            for v in reversed(variants)
            if v.name == b.variant
            or (
                ledger.fits(b.server, v.demand(app.rate_rps))
                and (spent + v.demand(app.rate_rps)).fits_in(inst.budget)
            )
        )
        ledger.take(b.server, best.demand(app.rate_rps))
        spent += best.demand(app.rate_rps)
        upgraded.append(WarmBackup(b.app, best.name, b.server))
    return upgraded


def solve_aggregated(inst: Instance, exact_coverage: bool, deadline: float) -> tuple[list[list[int]], float]:
    """Step 1: variant choice only. Returns the chosen variants per app and an upper bound."""
    pairs = [(i, j) for i, j in inst.pairs() if inst.eligible(i, j).any()]
    n, n_apps, r = len(pairs), len(inst.apps), inst.replicas
    if n == 0:
        return [[] for _ in inst.apps], 0.0
    app_of = np.array([i for i, _ in pairs])
    memory = np.array([inst.demand(i, j).memory_mb for i, j in pairs])
    compute = np.array([inst.demand(i, j).compute for i, j in pairs])
    cost = np.array([inst.value(i, j) for i, j in pairs])
    reach = np.zeros((n_apps, len(inst.servers)), dtype=bool)
    for i, j in pairs:
        reach[i] |= inst.eligible(i, j)
    cover = np.minimum(reach.sum(axis=1), r).astype(float)
    # Size classes (valid for every full solution): a server whose free memory is m holds at most
    # floor(m / s) backups of s MB or more. This is what makes the bound see fragmentation.
    sizes = np.unique(memory)
    holds = np.floor((inst.free_memory[None, :] + 1e-6) / sizes[:, None]).sum(axis=1)
    size_rows, size_cols = np.nonzero(memory[None, :] >= sizes[:, None])
    from scipy import sparse  # here: agents import this module, never solve

    matrix = sparse.csc_matrix(
        (
            np.concatenate([np.ones(n), memory, compute, np.ones(len(size_cols))]),
            (
                np.concatenate([app_of, np.full(n, n_apps), np.full(n, n_apps + 1), n_apps + 2 + size_rows]),
                np.concatenate([np.arange(n), np.arange(n), np.arange(n), size_cols]),
            ),
        ),
        shape=(n_apps + 2 + len(sizes), n),
    )
    lower = np.concatenate(
        [cover if exact_coverage else np.zeros(n_apps), [-INF, -INF], np.full(len(sizes), -INF)]
    )
    upper = np.concatenate([cover, [inst.budget.memory_mb, inst.budget.compute], holds])
    result = maximize(
        cost,
        matrix,
        lower,
        upper,
        np.full(n, float(r)),
        time_limit_s=seconds_left(deadline),
        mip_rel_gap=inst.params.ilp_mip_gap / 4,
        seed=inst.params.seed,
    )
    if not result.feasible and exact_coverage:
        return solve_aggregated(inst, False, deadline)
    targets: list[list[int]] = [[] for _ in inst.apps]
    for c in np.flatnonzero(result.x > 0.5):
        i, j = pairs[c]
        targets[i].extend([j] * round(result.x[c]))
    return targets, result.dual_bound


def neighbourhood(inst: Instance, backups: Sequence[WarmBackup], per_app: int) -> np.ndarray:
    """Servers each app may use in step 3: where its backups are, the roomiest, and random ones."""
    rng = np.random.default_rng(inst.params.seed)
    n_apps, n_servers = len(inst.apps), len(inst.servers)
    app_pos = {a.name: i for i, a in enumerate(inst.apps)}
    server_pos = {s: k for k, s in enumerate(inst.servers)}
    taken = np.zeros(n_servers)
    allowed = np.zeros((n_apps, n_servers), dtype=bool)
    for b in backups:
        i, k = app_pos[b.app], server_pos[b.server]
        allowed[i, k] = True
        app = inst.apps[i]
        taken[k] += inst.scenario.variant_of(app, b.variant).memory_mb
    roomiest = np.argsort(-(inst.free_memory - taken), kind="stable")[:per_app]
    allowed[:, roomiest] = True
    extra = rng.integers(0, n_servers, size=(n_apps, per_app))
    allowed[np.repeat(np.arange(n_apps), per_app), extra.ravel()] = True
    return allowed & ~inst.excluded


def _gap(value: float, bound: float) -> float:
    if not np.isfinite(bound):
        return INF
    if value <= 0:
        return 0.0 if bound <= 1e-9 else INF
    return max(bound - value, 0.0) / value
