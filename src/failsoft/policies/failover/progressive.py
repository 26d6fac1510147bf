"""Progressive failover: FailLite's Algorithm 1 (section 3.3) and its progressive loading.

Central idea: when a failure strikes there is no time for an ILP, so pick variants by a single
*demand ratio* ``delta = available capacity / maximum demand`` of the affected apps. ``delta >= 1``
means every app could get its full size back; ``delta = 0.5`` means about half of it. Each app
starts from the variant closest to ``delta`` of its full size (``match``), is placed worst-fit by
free memory, trying smaller variants until one fits, and is finally upgraded to the largest variant
its chosen server can still hold (``upgrade_model``).

Loading is progressive: the family's smallest variant is loaded first and served (low MTTR), the
final variant is loaded in the background and traffic switches to it. The small variant needs room
beside the final one while both are loaded. On the final's server, upgrades run one at a time, so
its apps share one transient slot; where ``upgrade_model`` left no such slot (it fills servers for
accuracy), failsoft lets the small variant *stand in on another server* with room
(``first_server``) until the final one is ready; the paper loads both on one server, which forces a
choice between accuracy (fill the server) and MTTR (keep room). Where no server has room, the final
variant is lowered until the slot fits (MTTR first: an outage is worse than a little accuracy).

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

    stand_ins = _StandIns(ledger)
    for app in ordered:
        if app.name not in chosen:
            continue
        variants, server = candidates[app.name], placed_on[app.name]
        first, first_server, final = stand_ins.place(app, variants, chosen[app.name], server)
        result.actions.append(
            FailoverAction(app.name, ActionKind.PROGRESSIVE, server, first.name, final.name, first_server)
        )
    return result


class _RoomMaker:
    """The make-room pass: frees a server for an app by dropping warm backups, then shrinking apps.

    A server's *room* is its free capacity plus what it would free; the extra part is kept per server
    (``extra``) and updated as apps are placed, so finding the roomiest server is one pass over them.
    """

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
        self.apps_on: dict[str, list[str]] = {}
        self.extra: dict[str, Demand] = {server: Demand() for server in ledger.servers()}
        for backup in reclaimable:
            if backup.server in ledger:
                self.warm_on.setdefault(backup.server, []).append(backup)
                self.extra[backup.server] += self._warm_demand(backup)
        for name, server in placed_on.items():
            self.apps_on.setdefault(server, []).append(name)
            self.extra[server] += self._shrinkable(name)
        self.released: list[WarmBackup] = []

    def _demand(self, app_name: str, j: int) -> Demand:
        app = self.scenario.app(app_name)
        return self.candidates[app_name][j].demand(app.rate_rps)

    def _shrinkable(self, app_name: str) -> Demand:
        return self._demand(app_name, self.chosen[app_name]) - self._demand(app_name, 0)

    def _warm_demand(self, backup: WarmBackup) -> Demand:
        app = self.scenario.app(backup.app)
        return self.scenario.variant_of(app, backup.variant).demand(app.rate_rps)

    def make_room_for(self, app: App) -> bool:
        need = self.candidates[app.name][0].demand(app.rate_rps)
        best, best_room = None, None
        for server, extra in self.extra.items():
            room = self.ledger.free(server) + extra
            if need.fits_in(room) and (
                best_room is None or (room.memory_mb, server) > (best_room.memory_mb, best)
            ):
                best, best_room = server, room
        if best is None:
            return False
        self._free_up(best, need)
        self.ledger.take(best, need)
        self.chosen[app.name], self.placed_on[app.name] = 0, best
        self.apps_on.setdefault(best, []).append(app.name)
        return True

    def _free_up(self, server: str, need: Demand) -> None:
        """Drop warm backups (least value per MB first), then shrink placed apps (largest first)."""
        backups = sorted(self.warm_on.get(server, []), key=self._warm_value_density)
        while not need.fits_in(self.ledger.free(server)) and backups:
            backup = backups.pop(0)
            self.warm_on[server].remove(backup)
            freed = self._warm_demand(backup)
            self.ledger.give(server, freed)
            self.extra[server] -= freed
            self.released.append(backup)
        shrinkable = sorted(
            (n for n in self.apps_on.get(server, []) if self.chosen[n] > 0),
            key=lambda n: (-self._demand(n, self.chosen[n]).memory_mb, n),
        )
        while not need.fits_in(self.ledger.free(server)) and shrinkable:
            name = shrinkable.pop(0)
            freed = self._shrinkable(name)
            self.ledger.give(server, freed)
            self.extra[server] -= freed
            self.chosen[name] = 0

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


class _StandIns:
    """Where each app's small first variant serves while its final variant loads.

    On the final's own server, upgrades run one at a time, so its apps share one transient slot as
    large as their largest small variant. Where that slot does not fit, the small variant stands in
    on another server with room (worst-fit); those stand-ins load at the same time, so they add up.
    Where neither fits, the final variant is lowered (not below the second-smallest) until the slot
    fits: a little accuracy for an MTTR of one small load instead of one large load. Only where that
    fails too is the final variant loaded directly.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger  # final variants (kept in step when one is lowered)
        self.room = Ledger({s: ledger.free(s) for s in ledger.servers()})  # minus transient stand-ins
        self.slot: dict[str, Demand] = {}

    def place(
        self, app: App, variants: Sequence[Variant], j: int, server: str
    ) -> tuple[Variant, str, Variant]:
        """(first variant, where it serves, final variant) for ``app`` placed with ``variants[j]``."""
        if j == 0:
            return variants[0], server, variants[0]
        small = variants[0].demand(app.rate_rps)
        if self._take_slot(server, small):
            return variants[0], server, variants[j]
        elsewhere = self.room.worst_fit(small, exclude={server})
        if elsewhere is not None:
            self.room.take(elsewhere, small)
            return variants[0], elsewhere, variants[j]
        for k in range(j - 1, 0, -1):  # lower the final variant to make the slot
            freed = variants[j].demand(app.rate_rps) - variants[k].demand(app.rate_rps)
            self.room.give(server, freed)
            if self._take_slot(server, small):
                self.ledger.give(server, freed)
                return variants[0], server, variants[k]
            self.room.take(server, freed)
        return variants[j], server, variants[j]

    def _take_slot(self, server: str, small: Demand) -> bool:
        slot = self.slot.get(server, Demand())
        grown = Demand(max(slot.memory_mb, small.memory_mb), max(slot.compute, small.compute))
        if not self.room.fits(server, grown - slot):
            return False
        self.room.take(server, grown - slot)
        self.slot[server] = grown
        return True
