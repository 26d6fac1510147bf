"""FailLite's experiments (sections 5.2-5.6, 5.8) as data: cluster shapes, swept points, failures.

Each :class:`Experiment` says what to build at each point of its sweep (a
:class:`~failsoft.synth.ClusterShape` over some families, synthesized as FailLite 5.1 builds its
clusters: primaries fill about 50% of memory and compute, the *headroom* sets what backups may use)
and which failure events to inject into it. :mod:`failsoft.sim.runner` runs every point under every
policy and seed.

=============== ======= ===========================================================================
experiment      figure  setup
=============== ======= ===========================================================================
testbed         Fig. 7  6 servers in 3 sites, the five testbed families, 46 apps, K = 50%,
                        alpha = 0.1, headroom 20%; each server fails in turn (x = its index)
headroom        Fig. 8  100 servers in 10 sites, 640 apps, the testbed families; headroom
                        10%..50%; single-server failures
criticality     Fig. 9  as headroom at 20%, with K (the critical share) from 0% to 100%
family          Fig. 10 all profiled families split in three classes by the memory difference of
                        their largest and smallest variants (small, medium, large); each class
                        alone, with as many apps as keep the primaries' total memory of the
                        headroom setup
site-failure    Fig. 11 as headroom at 20%, warm backups in another site (3.4); 1 to 7 of the 10
                        sites fail at once
scalability     Fig. 13 planner time: 500 servers, 1000 apps, 4-variant families, varying servers
                        (100..1000), apps (500..3000) and variants (2..7); half the sites fail
=============== ======= ===========================================================================
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from failsoft.domain import Family, PolicyParams, Scenario
from failsoft.errors import ConfigError
from failsoft.profiles import TESTBED_FAMILIES, load_profile_families, trimmed
from failsoft.sim.config import RequestMode, SimConfig
from failsoft.synth import ClusterShape


@dataclass(frozen=True, slots=True)
class Point:
    """One x value of a sweep. ``axis`` names what varies; ``label`` is how figures print it."""

    axis: str
    x: float
    label: str = ""


@dataclass(frozen=True)
class Experiment:
    name: str
    figure: str
    title: str
    points: tuple[Point, ...]
    shape: Callable[[Point], ClusterShape]
    families: Callable[[Sequence[Family], Point], tuple[Family, ...]]
    failures: Callable[[Scenario, Point, random.Random, int], list[tuple[str, ...]]]
    default_failures: int  # failure events per (policy, point, seed); 0: every server in turn
    config: SimConfig = field(default_factory=SimConfig)
    plot: str = "lines"  # lines | bars | testbed | scalability


# ----------------------------------------------------------------------------------------------
# Families.
# ----------------------------------------------------------------------------------------------


def testbed_families(families: Sequence[Family]) -> tuple[Family, ...]:
    """FailLite's five testbed families when present (the bundled profiles), else all of them."""
    chosen = tuple(f for f in families if f.name in TESTBED_FAMILIES)
    return chosen if len(chosen) == len(TESTBED_FAMILIES) else tuple(families)


def family_classes(families: Sequence[Family]) -> dict[str, tuple[Family, ...]]:
    """Small / medium / large classes by the largest-minus-smallest memory of a family (5.5).

    The families are ranked by that difference and split into three near-equal groups; on the
    bundled A2 profiles this puts mnasnet, mobilenet, shufflenet, densenet (12-64 MB) in small,
    resnext, efficientnet, regnet_x (382-486 MB) in medium, convnext, resnet, regnet (770-998 MB)
    in large.
    """
    ranked = sorted(families, key=lambda f: (f.largest.memory_mb - f.smallest.memory_mb, f.name))
    if len(ranked) < 3:
        raise ConfigError(f"the family experiment needs at least 3 families, got {len(ranked)}")
    cut = [math.ceil(len(ranked) * k / 3) for k in (1, 2)]
    return {
        "small": tuple(ranked[: cut[0]]),
        "medium": tuple(ranked[cut[0] : cut[1]]),
        "large": tuple(ranked[cut[1] :]),
    }


def _mean_largest(families: Sequence[Family]) -> float:
    return sum(f.largest.memory_mb for f in families) / len(families)


def _trim_to(families: Sequence[Family], n: int) -> tuple[Family, ...]:
    kept = tuple(trimmed(f, n) for f in families if len(f.variants) >= n)
    if not kept:
        raise ConfigError(f"no family has {n} variants")
    return kept


# ----------------------------------------------------------------------------------------------
# Failure events.
# ----------------------------------------------------------------------------------------------


def each_server(scenario: Scenario, rng: random.Random, n: int) -> list[tuple[str, ...]]:
    """Single-server failures: every server in turn (``n`` = 0), or ``n`` distinct random ones."""
    names = [s.name for s in scenario.servers]
    chosen = names if n <= 0 or n >= len(names) else sorted(rng.sample(names, n))
    return [(name,) for name in chosen]


def site_sets(scenario: Scenario, k: int, rng: random.Random, n: int) -> list[tuple[str, ...]]:
    """``n`` events, each failing ``k`` distinct random sites at once (all their servers)."""
    sites = [s.name for s in scenario.sites]
    if k > len(sites):
        raise ConfigError(f"cannot fail {k} of {len(sites)} sites")
    return [scenario.servers_in_sites(rng.sample(sites, k)) for _ in range(max(n, 1))]


# ----------------------------------------------------------------------------------------------
# The experiments.
# ----------------------------------------------------------------------------------------------

_LARGE = ClusterShape(n_servers=100, n_sites=10, n_apps=640, critical_fraction=0.5, headroom=0.2)


def _testbed() -> Experiment:
    return Experiment(
        "testbed",
        "Fig. 7",
        "Testbed: 6 servers, 3 sites, 46 apps, each server failed in turn",
        tuple(Point("failed server", i, f"s{i}") for i in range(6)),
        lambda p: ClusterShape(6, 3, 46, critical_fraction=0.5, headroom=0.2),
        lambda fams, p: testbed_families(fams),
        lambda sc, p, rng, n: [(sc.servers[int(p.x)].name,)],
        1,
        SimConfig(requests=RequestMode.ALL),
        "testbed",
    )


def _headroom() -> Experiment:
    return Experiment(
        "headroom",
        "Fig. 8",
        "Impact of resource constraints (100 servers, 10 sites, 640 apps)",
        tuple(Point("headroom", h, f"{h:.0%}") for h in (0.1, 0.2, 0.3, 0.4, 0.5)),
        lambda p: dataclasses.replace(_LARGE, headroom=p.x),
        lambda fams, p: testbed_families(fams),
        lambda sc, p, rng, n: each_server(sc, rng, n),
        0,
    )


def _criticality() -> Experiment:
    return Experiment(
        "criticality",
        "Fig. 9",
        "Impact of the critical share K (100 servers, headroom 20%)",
        tuple(Point("K", k, f"{k:.0%}") for k in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
        lambda p: dataclasses.replace(_LARGE, critical_fraction=p.x),
        lambda fams, p: testbed_families(fams),
        lambda sc, p, rng, n: each_server(sc, rng, n),
        0,
    )


def _family_apps(families: Sequence[Family], point: Point) -> tuple[Family, ...]:
    return family_classes(families)[point.label]


def _family() -> Experiment:
    def shape(point: Point) -> ClusterShape:
        return dataclasses.replace(_LARGE, n_apps=int(point.x))

    return Experiment(
        "family",
        "Fig. 10",
        "Impact of the model family class (100 servers, headroom 20%)",
        (),  # filled in by with_family_points once the families are known
        shape,
        _family_apps,
        lambda sc, p, rng, n: each_server(sc, rng, n),
        0,
        plot="bars",
    )


def with_family_points(experiment: Experiment, families: Sequence[Family]) -> Experiment:
    """The family experiment's points: one per class, x = its app count (same primary memory)."""
    reference = _mean_largest(testbed_families(families)) * _LARGE.n_apps
    points = tuple(
        Point("apps", round(reference / _mean_largest(fams)), name)
        for name, fams in family_classes(families).items()
    )
    return dataclasses.replace(experiment, points=points)


def _site_failure() -> Experiment:
    site_independent = PolicyParams(site_independent=True)
    return Experiment(
        "site-failure",
        "Fig. 11",
        "Impact of edge site failures (100 servers in 10 sites, site-independent warm backups)",
        tuple(Point("failed sites", k, str(k)) for k in range(1, 8)),
        lambda p: dataclasses.replace(_LARGE, policy=site_independent),
        lambda fams, p: testbed_families(fams),
        lambda sc, p, rng, n: site_sets(sc, int(p.x), rng, n),
        10,
    )


_SCALE_BASE = {"servers": 500, "apps": 1000, "variants": 4}
_SCALE_AXES = {
    "servers": (100, 250, 500, 750, 1000),
    "apps": (500, 1000, 1500, 2000, 2500, 3000),
    "variants": (2, 3, 4, 5, 6, 7),
}


def _scale(point: Point) -> dict[str, int]:
    return {**_SCALE_BASE, point.axis: int(point.x)}


def _scalability() -> Experiment:
    fast_ilp = PolicyParams(ilp_time_limit_s=2.0)  # the warm backups are set-up here, not measured
    return Experiment(
        "scalability",
        "Fig. 13",
        "Planner scalability: plan_failover time when half the sites fail",
        tuple(Point(axis, x, str(x)) for axis, xs in _SCALE_AXES.items() for x in xs),
        lambda p: ClusterShape(_scale(p)["servers"], 10, _scale(p)["apps"], policy=fast_ilp),
        lambda fams, p: _trim_to(fams, _scale(p)["variants"]),
        lambda sc, p, rng, n: site_sets(sc, 5, rng, n),
        1,
        SimConfig(requests=RequestMode.OFF),
        "scalability",
    )


EXPERIMENTS: dict[str, Callable[[], Experiment]] = {
    "testbed": _testbed,
    "headroom": _headroom,
    "criticality": _criticality,
    "family": _family,
    "site-failure": _site_failure,
    "scalability": _scalability,
}


def get_experiment(name: str, families: Sequence[Family]) -> Experiment:
    """The experiment called ``name``, its points resolved against ``families``."""
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r} (known: {', '.join(EXPERIMENTS)})")
    experiment = EXPERIMENTS[name]()
    if name == "family":
        experiment = with_family_points(experiment, families)
    return experiment


def load_families(profiles: str | None = None, zoo: str | None = None) -> tuple[Family, ...]:
    """The measured families to simulate: the zoo's profiles when a repository is given, else a
    profile CSV (the bundled A2 measurements by default)."""
    if zoo is not None:
        try:
            from failsoft.zoo import ModelRepository
        except ImportError as exc:
            raise ConfigError(f"--zoo needs failsoft.zoo, which this installation lacks ({exc})") from exc
        families = tuple(ModelRepository(zoo).families())
        if not families:
            raise ConfigError(f"the model repository {zoo!r} has no profiled families")
        return families
    return load_profile_families(profiles)
