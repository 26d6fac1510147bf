"""The DP mapping against brute force, the MILP against exhaustive search, the annealing against the MILP."""

from __future__ import annotations

import itertools

import pytest

from failsoft.adaptation_data import efficientnet_ladder
from failsoft.bench.adaptation_plan import instance
from failsoft.policies import registry
from failsoft.policies.adaptation.exact import solve
from failsoft.policies.adaptation.mapping import Table, place, rate_units
from failsoft.policies.adaptation.model import ClientSnapshot, Ladder, Plan, Snapshot, feasible
from failsoft.policies.adaptation.selection import JellyfishPolicy

from .conftest import random_snapshot, toy_ladder


def _best_rate(snapshot: Snapshot, rung: int, pool: list[ClientSnapshot]) -> float:
    best = 0.0
    for n in range(1, len(pool) + 1):
        for subset in itertools.combinations(pool, n):
            if feasible(snapshot, rung, subset) >= 0:
                best = max(best, sum(c.fps for c in subset))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_finds_the_largest_servable_rate_of_every_rung(seed: int) -> None:
    snapshot = random_snapshot(toy_ladder(), 1, 8, seed)
    table = Table(snapshot)
    for rung in range(snapshot.ladder.size):
        chosen = [snapshot.clients[i] for i in table.best_subset(rung, (1 << len(snapshot.clients)) - 1)]
        assert feasible(snapshot, rung, chosen) >= 0
        assert sum(c.fps for c in chosen) == _best_rate(snapshot, rung, list(snapshot.clients))


def test_dp_picks_the_smaller_batch_subset_when_it_carries_more(ladder: Ladder) -> None:
    # The paper's Fig. 8 situation: a larger batch carries more rate but fewer clients fit its latency.
    lat = ladder.latency_ms[1]  # rung m: 10, 15, 20, 25 ms
    tight = ClientSnapshot("tight", 60.0, (0.0, 2 * lat[1] + 0.1, 0.0))  # batch <= 2 on rung m
    loose = [ClientSnapshot(f"l{i}", 60.0, (0.0, 2 * lat[3], 0.0)) for i in range(2)]
    snapshot = Snapshot(ladder, (tight, *loose), ("w0",))
    chosen = Table(snapshot).best_subset(1, 0b111)
    rate = sum(snapshot.clients[i].fps for i in chosen)
    assert rate == _best_rate(snapshot, 1, list(snapshot.clients))
    assert feasible(snapshot, 1, [snapshot.clients[i] for i in chosen]) >= 0


def test_rate_units_are_the_exact_common_divisor() -> None:
    assert rate_units([15.0, 25.0]) == ([3, 5], 5.0)
    assert rate_units([12.5, 10.0]) == ([5, 4], 2.5)
    weights, unit = rate_units([29.97, 15.0])
    assert [w * unit for w in weights] == pytest.approx([29.97, 15.0])


def test_place_moves_each_worker_as_little_as_possible() -> None:
    assert place([0, 5, 2], [4, 1, 6]) == [1, 6, 4]


def _exhaustive(snapshot: Snapshot) -> tuple[float, float]:
    """Optimum of (served rate, accuracy sum) over every assignment of clients to workers and rungs."""
    ladder, n_k = snapshot.ladder, len(snapshot.workers)
    best = (0.0, 0.0)
    for rungs in itertools.combinations_with_replacement(range(ladder.size), n_k):
        for owner in itertools.product(range(n_k + 1), repeat=len(snapshot.clients)):
            groups = [[c for c, o in zip(snapshot.clients, owner, strict=True) if o == k] for k in range(n_k)]
            if any(g and feasible(snapshot, r, g) < 0 for r, g in zip(rungs, groups, strict=True)):
                continue
            served = sum(c.fps for g in groups for c in g)
            value = sum(ladder.accuracy[r] * c.fps for r, g in zip(rungs, groups, strict=True) for c in g)
            best = max(best, (round(served, 9), round(value, 9)))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_milp_reaches_the_exhaustive_optimum(seed: int) -> None:
    snapshot = random_snapshot(toy_ladder(max_batch=3), 2, 5, seed)
    plan, result = solve(snapshot, time_limit_s=20)
    served, value = _exhaustive(snapshot)
    assert result.optimal
    assert plan.served_fps == pytest.approx(served)
    assert plan.accuracy * snapshot.total_fps == pytest.approx(value)


def _check_plan(snapshot: Snapshot, plan: Plan) -> None:
    names = [c for w in plan.workers for c in w.clients]
    assert len(names) == len(set(names))
    assert set(names) | set(plan.unserved) == {c.name for c in snapshot.clients}
    by_name = {c.name: c for c in snapshot.clients}
    for w in plan.workers:
        if w.clients:
            assert feasible(snapshot, w.rung, [by_name[c] for c in w.clients]) == w.batch >= 1


@pytest.mark.parametrize(("workers", "clients", "seed"), [(2, 8, 0), (2, 8, 1), (3, 10, 2), (3, 12, 3)])
def test_annealing_is_within_two_percent_of_the_milp(workers: int, clients: int, seed: int) -> None:
    snapshot = instance(efficientnet_ladder(), workers, clients, seed)
    heuristic = JellyfishPolicy(seed).plan(snapshot)
    exact, result = solve(snapshot, time_limit_s=20)
    _check_plan(snapshot, heuristic)
    assert result.optimal
    assert heuristic.served_fps == pytest.approx(exact.served_fps)
    assert heuristic.accuracy >= 0.98 * exact.accuracy


def test_annealing_is_reproducible_and_incremental() -> None:
    snapshot = random_snapshot(toy_ladder(), 3, 9, 5)
    first, again = JellyfishPolicy(7).plan(snapshot), JellyfishPolicy(7).plan(snapshot)
    assert first == again
    moved = Snapshot(snapshot.ladder, snapshot.clients, snapshot.workers, current=(2, 0, 1))
    plan = JellyfishPolicy(7).plan(moved)
    _check_plan(moved, plan)
    # section 4.4: the worker holding the smallest variant gets the smallest new one, and so on
    pairs = sorted(zip(moved.current, plan.workers, strict=True), key=lambda p: p[0])
    by_current = [w.rung for _, w in pairs]
    assert by_current == sorted(by_current)


def test_upgrade_still_raises_accuracy_when_not_everyone_fits(ladder: Ladder) -> None:
    # One worker, more rate than any rung carries: DEGRADE cannot serve all, UPGRADE must still run.
    clients = tuple(ClientSnapshot(f"c{i}", 100.0, (200.0, 200.0, 200.0)) for i in range(8))
    snapshot = Snapshot(ladder, clients, ("w0",))
    plan = JellyfishPolicy(0).plan(snapshot)
    exact, _ = solve(snapshot, time_limit_s=20)
    assert plan.unserved
    assert plan.objective == pytest.approx(exact.objective)


def test_registry_lists_the_adaptation_policies() -> None:
    assert {"jellyfish", "edf-small", "edf-medium", "edf-large", "milp"} <= set(registry.names("adaptation"))
    snapshot = random_snapshot(toy_ladder(), 2, 6, 1)
    plans = {name: registry.make("adaptation", name).plan(snapshot) for name in ("edf-small", "edf-large")}
    assert {w.rung for w in plans["edf-small"].workers} == {0}
    assert {w.rung for w in plans["edf-large"].workers} == {snapshot.ladder.size - 1}
    assert all(p.pooled for p in plans.values())
    # the large variant's budget test excludes the clients whose budget it cannot meet
    assert len(plans["edf-large"].unserved) >= len(plans["edf-small"].unserved)
