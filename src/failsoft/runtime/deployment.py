"""From a config and the repository's measured families to the cluster snapshot that is deployed.

FailLite 3.4, step 1: an app arrives with a *predetermined* primary placement (the user's choice, or
the placer's), then the proactive policy picks its warm backups. Where the config leaves the primary
open, failsoft chooses like FailLite's testbed (5.1) does:

* the variant: the most accurate one that meets the app's SLO (the fastest one when none does);
* the server: worst-fit, the live server with the most free memory that holds the variant's memory
  and compute demand (``rate_rps * latency_ms / 1000``); apps with a fixed server are placed first,
  the others largest first (worst-fit decreasing).

Everything here is pure: no process, no file. A primary that cannot be placed, an unknown family or
variant, is one :class:`~failsoft.errors.ConfigError` naming the app.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from failsoft.domain import App, Demand, Family, Placement, Scenario, Variant
from failsoft.errors import ConfigError
from failsoft.runtime.config import AppConfig, RuntimeConfig


def resolve(
    config: RuntimeConfig,
    families: Sequence[Family],
    repository: str = "repository",
    keep: Mapping[str, App] | None = None,
) -> Scenario:
    """The deployed snapshot: the config's servers and apps, every app with a primary placement.

    ``keep`` (a deploy to a running cluster): the apps as they run; one whose config leaves its
    server open keeps the home it has (and its variant, where the config names none), so that
    deploying the same config again moves nothing.
    """
    index = {f.name: f for f in families}
    if keep:
        config = config.replace(apps=tuple(_kept(a, keep.get(a.name), index) for a in config.apps))
    chosen: dict[str, Variant] = {}
    for i, app in enumerate(config.apps):
        family = index.get(app.family)
        if family is None:
            known = ", ".join(sorted(index)) or "none"
            raise ConfigError(
                f"{config.source}: apps[{i}] ({app.name!r}): family {app.family!r} is not in the "
                f"{repository} (it has: {known})"
            )
        chosen[app.name] = _variant(config, i, app, family)
    free = {s.name: s.capacity for s in config.servers}
    placed: dict[str, Placement] = {}
    fixed = [a for a in config.apps if a.server is not None]
    rest = sorted(
        (a for a in config.apps if a.server is None), key=lambda a: (-chosen[a.name].memory_mb, a.name)
    )
    for app in fixed + rest:
        demand = chosen[app.name].demand(app.rate_rps)
        server = app.server or _worst_fit(free, demand)
        if server is None or not demand.fits_in(free[server]):
            where = f"server {server!r}" if server else "any server"
            room = (
                f" (free {free[server].memory_mb:g} MB, {free[server].compute:g} compute)" if server else ""
            )
            raise ConfigError(
                f"{config.source}: app {app.name!r}: variant {chosen[app.name].name!r} "
                f"({demand.memory_mb:g} MB, {demand.compute:.3g} compute) does not fit on {where}{room}"
            )
        free[server] = free[server] - demand
        placed[app.name] = Placement(server, chosen[app.name].name)
    apps = tuple(
        App(a.name, a.family, placed[a.name], a.critical, a.rate_rps, a.slo_ms, a.replicas, a.autoscaling)
        for a in config.apps
    )
    used = tuple(f for f in families if any(a.family == f.name for a in config.apps))
    return Scenario(config.servers, used, apps, config.params, None, config.services)


def _kept(app: AppConfig, running: App | None, families: Mapping[str, Family]) -> AppConfig:
    """``app`` on the home it runs on, where its config leaves the server (and variant) open."""
    if running is None or running.primary is None or app.server is not None or running.family != app.family:
        return app
    family = families.get(app.family)
    home = running.primary
    if family is None or not family.has_variant(home.variant):
        return app
    if app.variant is not None and app.variant != home.variant:
        return app  # a new variant: placed afresh, like a new app
    return dataclasses.replace(app, server=home.server, variant=home.variant)


def _variant(config: RuntimeConfig, i: int, app: AppConfig, family: Family) -> Variant:
    if app.variant is not None:
        if not family.has_variant(app.variant):
            raise ConfigError(
                f"{config.source}: apps[{i}] ({app.name!r}): family {family.name!r} has no variant "
                f"{app.variant!r} (known: {', '.join(v.name for v in family.variants)})"
            )
        return family.variant(app.variant)
    probe = App(app.name, family.name, None, app.critical, app.rate_rps, app.slo_ms)
    in_slo = [v for v in family.variants if probe.meets_slo(v)]
    if not in_slo:
        return min(family.variants, key=lambda v: (v.latency_ms, v.memory_mb))
    return max(in_slo, key=lambda v: (v.accuracy, -v.memory_mb))


def _worst_fit(free: dict[str, Demand], demand: Demand) -> str | None:
    fitting = [s for s, room in free.items() if demand.fits_in(room)]
    if not fitting:
        return None
    return max(fitting, key=lambda s: (free[s].memory_mb, free[s].compute, s))
