"""Pieces every failover policy shares: who is affected, which variants may serve, warm switches.

Two rules hold for every policy:

* a backup is never larger than the primary it stands in for (the primary's variant is the app's
  *full size*), and it meets the app's latency SLO. When no variant of the family meets the SLO,
  recovery uses the family's variants anyway (fail-soft: a slow answer beats none) but warm
  backups, which the ILP plans in advance, keep to the SLO strictly;
* an app whose primary server failed and that has a warm backup on a live server switches to it at
  once (``kind: warm``): the backup is already loaded, its capacity already reserved.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from failsoft.domain import ActionKind, App, FailoverAction, Scenario, Variant, WarmBackup
from failsoft.policies.failover.ledger import Ledger


@dataclass
class Failure:
    """What every policy knows once warm switches are done: the input of ``FailoverPolicy.recover``."""

    scenario: Scenario
    failed: tuple[str, ...]
    ledger: Ledger  # free capacity of the live servers, warm switches and warm backups taken
    warm: list[FailoverAction]  # the warm switches already decided
    rest: list[App]  # affected apps without a live warm backup


@dataclass
class Recovery:
    """What a policy decided for the affected apps that had no live warm backup."""

    actions: list[FailoverAction] = field(default_factory=list)
    unrecovered: list[str] = field(default_factory=list)
    released: list[WarmBackup] = field(default_factory=list)  # warm backups dropped to make room


def candidate_variants(scenario: Scenario, app: App, strict_slo: bool = False) -> tuple[Variant, ...]:
    """Variants that may stand in for ``app``'s primary, smallest first."""
    full = scenario.primary_variant(app)
    family = scenario.family(app.family)
    no_larger = [v for v in family.variants if v.memory_mb <= full.memory_mb]
    in_slo = [v for v in no_larger if app.meets_slo(v)]
    if in_slo or strict_slo:
        return tuple(in_slo)
    return tuple(no_larger)


def affected_apps(scenario: Scenario, failed: Collection[str]) -> list[App]:
    """Apps whose primary (current serving location) is on a failed server, in scenario order."""
    return [a for a in scenario.apps if a.primary is not None and a.primary.server in failed]


def recovery_order(scenario: Scenario, apps: Iterable[App]) -> list[App]:
    """Critical apps first, then larger primaries first (first-fit-decreasing packs better)."""
    return sorted(apps, key=lambda a: (not a.critical, -scenario.primary_variant(a).memory_mb, a.name))


def warm_exclusions(scenario: Scenario, app: App) -> set[str]:
    """Servers a warm backup of ``app`` may not use: its primary's, and its site's when required."""
    assert app.primary is not None
    if scenario.policy.site_independent:
        site = scenario.server(app.primary.server).site
        return set(scenario.servers_in_sites([site]))
    return {app.primary.server}


def live_warm_backups(scenario: Scenario, failed: Collection[str]) -> dict[str, list[WarmBackup]]:
    by_app: dict[str, list[WarmBackup]] = {}
    for backup in scenario.warm or ():
        if backup.server not in failed:
            by_app.setdefault(backup.app, []).append(backup)
    return by_app


def warm_switches(
    scenario: Scenario, affected: list[App], failed: Collection[str], ledger: Ledger
) -> tuple[list[FailoverAction], list[App]]:
    """Switch affected apps with a live warm backup to the most accurate one; return the rest."""
    backups = live_warm_backups(scenario, failed)
    actions: list[FailoverAction] = []
    rest: list[App] = []
    for app in affected:
        options = backups.get(app.name)
        if not options:
            rest.append(app)
            continue
        best = options[0]
        if len(options) > 1:  # the ledger only breaks ties between backups
            best = max(
                options,
                key=lambda b: (
                    scenario.variant_of(app, b.variant).accuracy,
                    ledger.free(b.server).memory_mb,
                    b.server,
                ),
            )
        actions.append(FailoverAction(app.name, ActionKind.WARM, best.server, best.variant, best.variant))
    return actions, rest


def initial_ledger(scenario: Scenario, failed: Collection[str]) -> Ledger:
    """Free capacity of the live servers, with primaries and known warm backups taken."""
    return Ledger(scenario.free(failed, include_warm=True))
