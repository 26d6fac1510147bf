"""Locality-aware recovery dispatch (Eq. 6, Alg. 2) and its baselines."""

from __future__ import annotations

from failsoft.policies.llm_recovery import (
    ClusterView,
    HolderFirst,
    Interrupted,
    LocalityAware,
    RecomputeAll,
    WorkerLoad,
)
from failsoft.services import LlmParams

P = LlmParams(alpha=0.0, beta=1.0, theta=1.5, tau=32)  # L = queue; holder overloaded above 1.5 x mean


def cluster(**queues: int) -> ClusterView:
    workers = [WorkerLoad("dead", alive=False)] + [WorkerLoad(n, q) for n, q in queues.items()]
    return ClusterView(tuple(workers))


def test_goes_to_the_holder_when_it_is_not_overloaded():
    v = cluster(a=10, b=10, c=10)
    (route,) = LocalityAware().route([Interrupted("r", 600, "a", 500, 150.0)], v, P)
    assert (route.worker, route.restore) == ("a", True)


def test_overloaded_holder_and_short_prefix_go_to_the_least_loaded_worker():
    v = cluster(a=40, b=10, c=5)  # mean 18.3, bound 27.5: a is overloaded
    (route,) = LocalityAware().route([Interrupted("r", 300, "a", 200, 60.0)], v, P)  # 13 pages <= tau
    assert (route.worker, route.restore) == ("c", False)


def test_overloaded_holder_keeps_a_long_prefix():
    v = cluster(a=40, b=10, c=5)
    (route,) = LocalityAware().route([Interrupted("r", 4000, "a", 3000, 900.0)], v, P)  # 188 pages > tau
    assert (route.worker, route.restore) == ("a", True)


def test_a_holder_that_is_down_or_no_checkpoint_means_recompute():
    v = ClusterView((WorkerLoad("a", alive=False), WorkerLoad("b", 3), WorkerLoad("c", 1)))
    routes = LocalityAware().route([Interrupted("r1", 100, "a", 80, 24.0), Interrupted("r2", 100)], v, P)
    assert [(r.worker, r.restore) for r in routes] == [("c", False), ("c", False)]


def test_loads_are_updated_as_requests_are_routed():
    """Alg. 2: each request routed to the holder raises its load, until the short prefixes go
    elsewhere; fixed-checkpointing sends them all to the holder."""
    v = cluster(a=10, b=10, c=10)  # bound 15
    items = [Interrupted(f"r{i}", 200, "a", 100, 30.0) for i in range(12)]
    lumen = LocalityAware().route(items, v, P)
    to_holder = [r for r in lumen if r.worker == "a"]
    assert len(to_holder) == 6  # queue 10 -> 15 stays within the bound, the 6th makes 16
    assert {r.worker for r in lumen if r.worker != "a"} == {"b", "c"}
    assert all(r.worker == "a" and r.restore for r in HolderFirst().route(items, v, P))


def test_stop_and_restart_recomputes_everything_on_the_least_loaded():
    v = cluster(a=3, b=1, c=2)
    routes = RecomputeAll().route(
        [Interrupted("r1", 100, "a", 90, 27.0), Interrupted("r2", 100, "a", 90, 27.0)], v, P
    )
    assert [(r.worker, r.restore) for r in routes] == [("b", False), ("b", False)]  # b: 1 -> 2, then tie -> b


def test_no_up_worker_holds_the_request():
    v = ClusterView((WorkerLoad("a", alive=False), WorkerLoad("b", serving=False)))
    (route,) = LocalityAware().route([Interrupted("r", 10)], v, P)
    assert route.worker is None and not route.restore
