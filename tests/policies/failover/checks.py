"""Independent checkers of the plans' guarantees, written from the paper, not from the code."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from failsoft.domain import ActionKind, Demand, FailoverPlan, ProactivePlan, Scenario


def allowed_variants(scenario: Scenario, app, strict_slo: bool):
    full = scenario.primary_variant(app)
    fam = scenario.family(app.family)
    no_larger = [v for v in fam.variants if v.memory_mb <= full.memory_mb]
    in_slo = [v for v in no_larger if app.slo_ms is None or v.latency_ms <= app.slo_ms]
    return in_slo if (in_slo or strict_slo) else no_larger


def check_warm_plan(
    scenario: Scenario,
    plan: ProactivePlan,
    budgeted: bool = True,
    any_variant: bool = True,
    wanted: set[str] | None = None,
):
    """Eqs. 2-7 of FailLite 3.2 (with 3.4's multi-replica and site-independence forms)."""
    params = scenario.policy
    free = scenario.free(include_warm=False)
    used: dict[str, Demand] = defaultdict(Demand)
    total = Demand()
    count: Counter[str] = Counter()
    where: dict[str, set[str]] = defaultdict(set)
    for w in plan.warm:
        app = scenario.app(w.app)
        variant = scenario.variant_of(app, w.variant)
        if any_variant:
            assert variant in allowed_variants(scenario, app, strict_slo=True), w
        assert w.server != app.primary.server, f"eq. 4: {w} shares its primary's server"
        if params.site_independent:
            assert scenario.server(w.server).site != scenario.server(app.primary.server).site, w
        assert w.server not in where[w.app], f"two backups of {w.app} on {w.server}"
        where[w.app].add(w.server)
        count[w.app] += 1
        d = variant.demand(app.rate_rps)
        used[w.server] += d
        total += d
    for server, d in used.items():
        assert d.fits_in(free[server]), f"eq. 2: server {server} overfilled: {d} > {free[server]}"
    if budgeted:
        cap = Demand()
        for d in free.values():
            cap += d
        assert total.fits_in(cap.scaled(1 - params.alpha)), "eq. 3: reserve for cold backups not kept"
    assert all(n <= params.warm_replicas for n in count.values())
    if wanted is None:
        wanted = {a.name for a in scenario.apps if a.critical}
    short = {name for name in wanted if count[name] < params.warm_replicas}
    assert set(plan.unplaced) == short


def check_failover_plan(scenario: Scenario, failed, plan: FailoverPlan):
    """Every affected app is recovered or reported; no live server ends up over capacity."""
    affected = {a.name for a in scenario.apps if a.primary and a.primary.server in failed}
    acted = [a.app for a in plan.actions]
    assert len(acted) == len(set(acted)), "an app got two actions"
    assert set(acted) | set(plan.unrecovered) == affected
    assert not set(acted) & set(plan.unrecovered)
    released = set(plan.released)
    warm_by_app = defaultdict(list)
    for w in scenario.warm or ():
        warm_by_app[w.app].append(w)
    used: dict[str, Demand] = defaultdict(Demand)
    for app in scenario.apps:
        if app.primary and app.primary.server not in failed:
            used[app.primary.server] += scenario.primary_variant(app).demand(app.rate_rps)
    for w in scenario.warm or ():
        if w.server not in failed and w not in released:
            app = scenario.app(w.app)
            used[w.server] += scenario.variant_of(app, w.variant).demand(app.rate_rps)
    for action in plan.actions:
        app = scenario.app(action.app)
        assert action.server not in failed
        final = scenario.variant_of(app, action.final_variant)
        first = scenario.variant_of(app, action.first_variant)
        assert first.memory_mb <= final.memory_mb
        assert final.memory_mb <= scenario.primary_variant(app).memory_mb
        if action.kind is ActionKind.WARM:
            assert any(
                w.server == action.server and w.variant == action.final_variant for w in warm_by_app[app.name]
            )
            assert (app.name, action.server) not in {(w.app, w.server) for w in released}
        else:
            used[action.server] += final.demand(app.rate_rps)
    for server, d in used.items():
        cap = scenario.server(server).capacity
        assert d.fits_in(cap), f"server {server} overfilled after failover: {d} > {cap}"
    # progressive loading: small first variants fit beside the final ones while they serve; on the
    # final's own server upgrades run one at a time (one shared slot), stand-ins elsewhere add up
    slot: dict[str, Demand] = defaultdict(Demand)
    guests: dict[str, Demand] = defaultdict(Demand)
    for action in plan.actions:
        if action.kind is ActionKind.PROGRESSIVE and action.first_variant != action.final_variant:
            app = scenario.app(action.app)
            first = scenario.variant_of(app, action.first_variant).demand(app.rate_rps)
            where = action.stand_in_server
            assert where not in failed
            if where == action.server:
                s = slot[where]
                slot[where] = Demand(max(s.memory_mb, first.memory_mb), max(s.compute, first.compute))
            else:
                guests[where] += first
    for server in set(slot) | set(guests):
        total = used[server] + slot[server] + guests[server]
        assert total.fits_in(scenario.server(server).capacity), f"stand-ins overfill {server}"


def approx(value):
    return pytest.approx(value, rel=1e-6, abs=1e-6)
