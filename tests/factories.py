"""Builders of small random scenarios for tests, seeded by the caller."""

from __future__ import annotations

import random

from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant


def make_family(name: str, sizes: list[tuple[float, float, float]]) -> Family:
    """A family from (memory_mb, accuracy, latency_ms) triples; load time grows with memory."""
    return Family(
        name,
        tuple(
            Variant(f"{name}-{i}", m, a, load_ms=m * 2.0, latency_ms=lat)
            for i, (m, a, lat) in enumerate(sizes)
        ),
    )


def random_scenario(
    rng: random.Random,
    n_servers: int,
    n_apps: int,
    n_sites: int = 2,
    critical_share: float = 0.6,
    policy: PolicyParams | None = None,
    memory_range: tuple[float, float] = (300, 1200),
    compute: float | None = None,
) -> Scenario:
    """A random cluster whose primaries fit: families of 2-4 variants, apps on random servers."""
    families = []
    for f in range(3):
        n_var = rng.randint(2, 4)
        mems = sorted(rng.uniform(20, 300) for _ in range(n_var))
        accs = sorted(rng.uniform(0.5, 0.95) for _ in range(n_var))
        lats = sorted(rng.uniform(1, 20) for _ in range(n_var))
        families.append(make_family(f"fam{f}", list(zip(mems, accs, lats, strict=True))))
    servers = [
        Server(
            f"s{k}",
            f"site{k % n_sites}",
            round(rng.uniform(*memory_range)),
            compute if compute is not None else round(rng.uniform(0.5, 2.0), 2),
        )
        for k in range(n_servers)
    ]
    used = {s.name: 0.0 for s in servers}
    apps = []
    for i in range(n_apps):
        family = rng.choice(families)
        variant = rng.choice(family.variants)
        fits = [s for s in servers if used[s.name] + variant.memory_mb <= s.memory_mb]
        if not fits:
            continue
        server = rng.choice(fits)
        used[server.name] += variant.memory_mb
        apps.append(
            App(
                f"a{i}",
                family.name,
                Placement(server.name, variant.name),
                rng.random() < critical_share,
                round(rng.uniform(0.5, 10), 2),
                rng.choice([None, 15.0, 30.0]),
            )
        )
    return Scenario(tuple(servers), tuple(families), tuple(apps), policy or PolicyParams(), None)
