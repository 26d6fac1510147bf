"""Progressive failover: FailLite's Algorithm 1 (section 3.3) and its progressive loading.

Central idea: when a failure strikes there is no time for an ILP, so pick variants by a single
*demand ratio* ``delta = available capacity / maximum demand`` of the affected apps. ``delta >= 1``
means every app could get its full size back; ``delta = 0.5`` means about half of it. Each app
starts from the variant closest to ``delta`` of its full size (``match``), is placed worst-fit by
free memory, trying smaller variants until one fits, and is finally upgraded to the largest variant
its chosen server can still hold (``upgrade_model``).

Loading is progressive: the smallest variant that fits beside the final one is loaded first and
served (low MTTR), the final variant is loaded in the background and traffic switches to it. Upgrades
on one server run one at a time, so a server needs room for all final variants plus the small
variant being replaced: the plan uses a small first variant only where that slack exists.

failsoft adds a *make-room* pass the paper does not have (fail-soft: an outage now is worse than
less insurance or less accuracy). An app that Algorithm 1 leaves without a server gets the server
with the most *room*: free capacity, plus what dropping warm backups of apps whose primaries are
alive would free (``reclaim_warm``), plus what shrinking the apps this plan already placed there to
their smallest variant would free. Warm backups go first (least accuracy x rate per MB first), then
placed apps shrink (largest first); the upgrade pass then grows everything back where room is left.
With it, worst-fit fragmentation is the only way an app stays down: if the free memory exceeds the
affected apps' smallest variants by one smallest variant per server, every app is recovered.
"""

from __future__ import annotations

from collections.abc import Sequence

from failsoft.domain import ActionKind, App, Demand, FailoverAction, Resource, Scenario, Variant, WarmBackup
from failsoft.policies.failover.common import Recovery, candidate_variants, recovery_order
from failsoft.policies.failover.ledger import Ledger


def demand_ratio(available: Demand, max_demand: Demand) -> float:
    """Algorithm 1 lines 2-4: the tightest resource's available-to-demanded ratio."""
    ratios = [available.get(r) / max_demand.get(r) for r in Resource if max_demand.get(r) > 0]
    return min(ratios) if ratios else float("inf")


def match(variants: Sequence[Variant], delta: float) -> int:
    """Index of the variant whose memory is closest to ``delta`` of the full size (ties: smaller)."""
    if delta >= 1.0:
        return len(variants) - 1
    target = delta * variants[-1].memory_mb
    return min(range(len(variants)), key=lambda j: (abs(variants[j].memory_mb - target), j))


def place_progressive(
    scenario: Scenario,
    apps: Sequence[App],
    ledger: Ledger,
    reclaimable: Sequence[WarmBackup] = (),
) -> Recovery:
    """Algorithm 1 over ``apps`` on the servers of ``ledger``, then make-room and upgrade passes.

    Takes what it places from the ledger. ``reclaimable`` are warm backups (already in the ledger)
    that may be dropped so that an app which would otherwise stay down can be served.
    """
    ordered = recovery_order(scenario, apps)
    candidates = {a.name: candidate_variants(scenario, a) for a in ordered}
    max_demand = Demand()
    for a in ordered:
        max_demand += candidates[a.name][-1].demand(a.rate_rps)
    delta = demand_ratio(ledger.total(), max_demand)

    chosen: dict[str, int] = {}
    placed_on: dict[str, str] = {}
    result = Recovery()
    for app in ordered:  # lines 5-12: match, then worst-fit from the matched variant down
        variants = candidates[app.name]
        for j in range(match(variants, delta), -1, -1):
            demand = variants[j].demand(app.rate_rps)
            server = ledger.worst_fit(demand)
            if server is not None:
                ledger.take(server, demand)
                chosen[app.name], placed_on[app.name] = j, server
                break
        else:
            result.unrecovered.append(app.name)

    if result.unrecovered:
        room = _RoomMaker(scenario, ledger, candidates, chosen, placed_on, reclaimable)
        still_down = []
        for name in result.unrecovered:
            if not room.make_room_for(scenario.app(name)):
                still_down.append(name)
        result.unrecovered = still_down
        result.released = room.released

    for app in ordered:  # lines 13-14: upgrade_model on the chosen server
        if app.name in chosen:
            chosen[app.name] = _upgrade(
                app, candidates[app.name], chosen[app.name], placed_on[app.name], ledger
            )

    for app in ordered:
        if app.name not in chosen:
            continue
        variants, server = candidates[app.name], placed_on[app.name]
        final = variants[chosen[app.name]]
        first = _first_variant(app, variants, final, ledger.free(server))
        result.actions.append(
            FailoverAction(app.name, ActionKind.PROGRESSIVE, server, first.name, final.name)
        )
    return result


class _RoomMaker:
    """The make-room pass: frees a server for an app by dropping warm backups, then shrinking apps."""

    def __init__(
        self,
        scenario: Scenario,
        ledger: Ledger,
        candidates: dict[str, tuple[Variant, ...]],
        chosen: dict[str, int],
        placed_on: dict[str, str],
        reclaimable: Sequence[WarmBackup],
    ) -> None:
        self.scenario, self.ledger = scenario, ledger
        self.candidates, self.chosen, self.placed_on = candidates, chosen, placed_on
        self.warm_on: dict[str, list[WarmBackup]] = {}
        for backup in reclaimable:
            if backup.server in ledger:
                self.warm_on.setdefault(backup.server, []).append(backup)
        self.released: list[WarmBackup] = []

    def _demand(self, app_name: str, j: int) -> Demand:
        app = self.scenario.app(app_name)
        return self.candidates[app_name][j].demand(app.rate_rps)

    def _warm_demand(self, backup: WarmBackup) -> Demand:
        app = self.scenario.app(backup.app)
        return self.scenario.variant_of(app, backup.variant).demand(app.rate_rps)

    def _room(self, server: str) -> Demand:
        room = self.ledger.free(server)
        for backup in self.warm_on.get(server, ()):
            room += self._warm_demand(backup)
        for name, where in self.placed_on.items():
            if where == server:
                room += self._demand(name, self.chosen[name]) - self._demand(name, 0)
        return room

    def make_room_for(self, app: App) -> bool:
        need = self.candidates[app.name][0].demand(app.rate_rps)
        rooms = {s: self._room(s) for s in self.ledger.servers()}
        fitting = [s for s, r in rooms.items() if need.fits_in(r)]
        if not fitting:
            return False
        server = max(fitting, key=lambda s: (rooms[s].memory_mb, s))
        backups = sorted(self.warm_on.get(server, []), key=self._warm_value_density)
        while not need.fits_in(self.ledger.free(server)) and backups:
            backup = backups.pop(0)
            self.warm_on[server].remove(backup)
            self.ledger.give(server, self._warm_demand(backup))
            self.released.append(backup)
        shrinkable = sorted(
            (n for n, w in self.placed_on.items() if w == server and self.chosen[n] > 0),
            key=lambda n: (-self._demand(n, self.chosen[n]).memory_mb, n),
        )
        while not need.fits_in(self.ledger.free(server)) and shrinkable:
            name = shrinkable.pop(0)
            self.ledger.give(server, self._demand(name, self.chosen[name]) - self._demand(name, 0))
            self.chosen[name] = 0
        self.ledger.take(server, need)
        self.chosen[app.name], self.placed_on[app.name] = 0, server
        return True

    def _warm_value_density(self, backup: WarmBackup) -> tuple[float, str]:
        app = self.scenario.app(backup.app)
        family = self.scenario.family(app.family)
        variant = family.variant(backup.variant)
        return (family.normalized_accuracy(variant) * app.rate_rps / variant.memory_mb, backup.app)


def _upgrade(app: App, variants: Sequence[Variant], j: int, server: str, ledger: Ledger) -> int:
    """The largest variant that fits where variant ``j`` was placed."""
    ledger.give(server, variants[j].demand(app.rate_rps))
    best = j
    for k in range(len(variants) - 1, j, -1):
        if ledger.fits(server, variants[k].demand(app.rate_rps)):
            best = k
            break
    ledger.take(server, variants[best].demand(app.rate_rps))
    return best


def _first_variant(app: App, variants: Sequence[Variant], final: Variant, slack: Demand) -> Variant:
    """The smallest variant that fits in the slack left once every final variant is loaded."""
    for v in variants:
        if v is final:
            return final
        if v.demand(app.rate_rps).fits_in(slack):
            return v
    return final
