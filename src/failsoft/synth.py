"""Synthetic clusters for benchmarks, property tests and the simulator, as FailLite 5.1 builds them.

FailLite deploys primaries to fill about ``utilization`` = 50% of every server's memory and compute,
then fixes the applications and controls the room usable for backups with a *headroom* parameter: the
share of a server's nominal capacity that backups may use (10% to 50%). :func:`synthesize` does the
same: apps draw a family at random, run its full-size variant, are spread by longest-processing-time
balancing (largest model to the least loaded server), and each server's usable capacity is set to
``used + headroom * used / utilization``. Same seed, same scenario.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from failsoft.domain import App, Demand, Family, Placement, PolicyParams, Scenario, Server
from failsoft.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """What to generate. ``critical_fraction`` is FailLite's K; ``headroom`` its free share."""

    n_servers: int
    n_sites: int
    n_apps: int
    critical_fraction: float = 0.5
    headroom: float = 0.2
    utilization: float = 0.5
    rate_rps: tuple[float, float] = (1.0, 10.0)
    slo_ms: float | None = 100.0
    primary_variant: str = "largest"  # or "random"
    policy: PolicyParams = field(default_factory=PolicyParams)

    def __post_init__(self) -> None:
        if self.n_servers < 1 or self.n_sites < 1 or self.n_apps < 0:
            raise ConfigError(f"cluster shape needs servers >= 1, sites >= 1, apps >= 0; got {self}")
        if self.n_sites > self.n_servers:
            raise ConfigError(f"{self.n_sites} sites cannot share {self.n_servers} servers")
        if not 0 <= self.critical_fraction <= 1:
            raise ConfigError(f"critical_fraction must be in [0, 1], got {self.critical_fraction}")
        if not 0 < self.utilization < 1:
            raise ConfigError(f"utilization must be in (0, 1), got {self.utilization}")
        if not 0 < self.headroom <= 1 - self.utilization:
            raise ConfigError(
                f"headroom must be in (0, 1 - utilization = {1 - self.utilization:g}], got {self.headroom}"
            )
        if self.primary_variant not in ("largest", "random"):
            raise ConfigError(f"primary_variant must be 'largest' or 'random', got {self.primary_variant!r}")


def synthesize(families: Sequence[Family], shape: ClusterShape, seed: int = 0) -> Scenario:
    if not families:
        raise ConfigError("synthesize needs at least one family")
    rng = random.Random(seed)
    per_site = math.ceil(shape.n_servers / shape.n_sites)
    names = [f"s{k:0{len(str(shape.n_servers))}d}" for k in range(shape.n_servers)]
    sites = [f"site-{k // per_site:02d}" for k in range(shape.n_servers)]

    drafts: list[tuple[str, Family, str, float]] = []
    for i in range(shape.n_apps):
        family = rng.choice(list(families))
        variant = family.largest if shape.primary_variant == "largest" else rng.choice(family.variants)
        rate = round(rng.uniform(*shape.rate_rps), 3)
        drafts.append((f"app-{i:04d}", family, variant.name, rate))
    n_critical = round(shape.critical_fraction * shape.n_apps)
    critical = set(rng.sample(range(shape.n_apps), n_critical))

    # Longest processing time first: the largest primaries go to the least-loaded server.
    used = {name: Demand() for name in names}
    order = sorted(range(len(drafts)), key=lambda i: -drafts[i][1].variant(drafts[i][2]).memory_mb)
    primary: dict[int, str] = {}
    for i in order:
        _, family, variant_name, rate = drafts[i]
        target = min(names, key=lambda n: (used[n].memory_mb, n))
        used[target] += family.variant(variant_name).demand(rate)
        primary[i] = target

    mean_memory = sum(u.memory_mb for u in used.values()) / len(used) or 1024.0
    mean_compute = sum(u.compute for u in used.values()) / len(used) or 1.0
    grow = 1.0 + shape.headroom / shape.utilization
    servers = []
    for name, site in zip(names, sites, strict=True):
        u = used[name]
        memory = (u.memory_mb or mean_memory) * grow
        compute = (u.compute or mean_compute) * grow
        servers.append(Server(name, site, math.ceil(memory), round(compute, 6) + 1e-6))

    apps = tuple(
        App(
            name,
            family.name,
            Placement(primary[i], variant),
            i in critical,
            rate,
            shape.slo_ms,
        )
        for i, (name, family, variant, rate) in enumerate(drafts)
    )
    used_families = {a.family for a in apps} or {f.name for f in families}
    fams = tuple(f for f in families if f.name in used_families)
    return Scenario(tuple(servers), fams, apps, shape.policy, None)
