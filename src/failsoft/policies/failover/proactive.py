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

see :mod:`failsoft.policies.failover.ilp_decompose`. The reported ``mip_gap`` is then measured
against a proven upper bound, so it is a true optimality gap either way.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from failsoft.domain import ProactivePlan, Scenario
from failsoft.policies.failover.ilp_decompose import greedy, solve_decomposed
from failsoft.policies.failover.ilp_model import build_columns, make_instance, solve_lexicographic
from failsoft.policies.failover.interface import elapsed_ms

# Above this many (app, variant, server) columns the full ILP is solved by decomposition.
FULL_MODEL_MAX_COLUMNS = 20_000


def plan_warm_ilp(
    scenario: Scenario, policy_name: str = "faillite", unavailable: Collection[str] = ()
) -> ProactivePlan:
    """Warm backups for the scenario's critical apps, as FailLite's ILP chooses them."""
    started = time.perf_counter()
    inst = make_instance(scenario, unavailable)
    deadline = started + scenario.policy.ilp_time_limit_s
    n_columns = inst.column_count() if scenario.policy.warm_replicas else 0
    if n_columns == 0:  # nothing to place, or nowhere to place it
        backups, gap, optimal = [], 0.0, True
    elif n_columns <= FULL_MODEL_MAX_COLUMNS:
        cols = build_columns(inst)
        result = solve_lexicographic(cols, cols.to_x(greedy(inst)), deadline)
        backups, gap, optimal = cols.to_backups(result.x), result.gap, result.optimal
    else:
        backups, gap, optimal = solve_decomposed(inst, deadline)
    placed: dict[str, int] = {}
    for b in backups:
        placed[b.app] = placed.get(b.app, 0) + 1
    unplaced = tuple(a.name for a in inst.apps if placed.get(a.name, 0) < inst.replicas)
    return ProactivePlan(
        policy_name, tuple(backups), unplaced, inst.objective(backups), elapsed_ms(started), gap, optimal
    )
