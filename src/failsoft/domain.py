"""The one domain model every layer speaks: policies, simulator, runtime, zoo and CLI.

Everything here is a small frozen dataclass with its unit in the field name (``memory_mb``,
``load_ms``, ``rate_rps``). A policy reads a :class:`Scenario` (a snapshot of the cluster) and returns
a plan (:class:`ProactivePlan`, :class:`FailoverPlan`); neither side mutates the other.

Two resources are accounted everywhere, as a :class:`Demand` vector:

* ``memory_mb``: accelerator (or host) memory a loaded variant takes;
* ``compute``: busy fraction of one device. An app served by a variant takes
  ``rate_rps * latency_ms / 1000`` of it, and a server's ``compute`` is its capacity in that unit
  (1.0 is one device fully busy). Latency is measured on the reference device of the profile and is
  taken as the same on every server: servers differ in capacity, not in speed.

In a snapshot an app's ``primary`` is where it is served *now*: after a failover the runtime hands
policies a scenario whose primaries are the current routes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt, Le, Lt

from failsoft.bounds import STRICT, check_bounds
from failsoft.services import Service, with_singles

_EPS = 1e-9


class Resource(StrEnum):
    MEMORY = "memory_mb"
    COMPUTE = "compute"


@dataclass(frozen=True, slots=True)
class Demand:
    """A resource vector: what a loaded model takes, or what a server has free."""

    memory_mb: float = 0.0
    compute: float = 0.0

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.memory_mb + other.memory_mb, self.compute + other.compute)

    def __sub__(self, other: Demand) -> Demand:
        return Demand(self.memory_mb - other.memory_mb, self.compute - other.compute)

    def scaled(self, factor: float) -> Demand:
        return Demand(self.memory_mb * factor, self.compute * factor)

    def fits_in(self, free: Demand) -> bool:
        """True when every resource of this demand is within ``free`` (with float slack)."""
        return self.memory_mb <= free.memory_mb + _EPS and self.compute <= free.compute + _EPS

    def clipped(self) -> Demand:
        """Negative components become zero (an overloaded server has nothing free, not less)."""
        return Demand(max(self.memory_mb, 0.0), max(self.compute, 0.0))

    def get(self, resource: Resource) -> float:
        return self.memory_mb if resource is Resource.MEMORY else self.compute


@dataclass(frozen=True, slots=True)
class Variant:
    """One trained model of a family, with its measured (or declared) profile.

    ``accuracy`` is top-1 in [0, 1]; ``accuracy_source`` says whether it was ``measured`` on a
    held-out split here or ``declared`` (a published number, see the zoo's profile for the source).
    """

    name: str
    memory_mb: float
    accuracy: float
    load_ms: float
    latency_ms: float
    accuracy_source: str = "declared"
    # measured latency of a whole batch, (batch size, ms) by growing size; () when only batch 1 is known
    batch_latency_ms: tuple[tuple[int, float], ...] = ()
    # the loading thread's CPU time in a cold load (the rest of ``load_ms`` waited for the disk);
    # None when not measured (profile CSVs): the whole load is taken as work
    load_cpu_ms: float | None = None
    # a load whose weights are already in the page cache (no disk read); None when not measured
    warm_load_ms: float | None = None

    @property
    def load_work_ms(self) -> float:
        """The CPU work in a cold load: ``load_cpu_ms`` where measured (never above ``load_ms``),
        else the whole ``load_ms`` (the conservative reading)."""
        return self.load_ms if self.load_cpu_ms is None else min(self.load_cpu_ms, self.load_ms)

    def demand(self, rate_rps: float) -> Demand:
        return Demand(self.memory_mb, rate_rps * self.latency_ms / 1000.0)

    def latency_at(self, batch: int, batch_cost: float = 1.0) -> float:
        """Milliseconds to answer a batch of ``batch`` requests.

        From the measured batch profile when there is one: linear between measured sizes, and beyond
        the largest at its per-request cost. Without one, ``latency_ms * (1 + batch_cost * (b - 1))``
        (``batch_cost`` 1: batching saves nothing, the conservative guess).
        """
        if batch < 1:
            raise ValueError(f"a batch has at least one request, got {batch}")
        points = self.batch_latency_ms
        if not points:
            return self.latency_ms * (1.0 + batch_cost * (batch - 1))
        if batch <= points[0][0]:
            return points[0][1] * batch / points[0][0]
        for (b0, t0), (b1, t1) in itertools.pairwise(points):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        b_last, t_last = points[-1]
        return t_last * batch / b_last


@dataclass(frozen=True, slots=True)
class Family:
    """Variants of one model that trade accuracy for size; ordered smallest to largest memory."""

    name: str
    variants: tuple[Variant, ...]

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"family {self.name!r} has no variants")
        ordered = tuple(sorted(self.variants, key=lambda v: (v.memory_mb, v.accuracy, v.name)))
        object.__setattr__(self, "variants", ordered)
        names = [v.name for v in ordered]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name!r} has duplicate variant names")

    @property
    def smallest(self) -> Variant:
        return self.variants[0]

    @property
    def largest(self) -> Variant:
        return self.variants[-1]

    @property
    def best_accuracy(self) -> float:
        return max(v.accuracy for v in self.variants)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"family {self.name!r} has no variant {name!r}")

    def has_variant(self, name: str) -> bool:
        return any(v.name == name for v in self.variants)

    def normalized_accuracy(self, variant: Variant) -> float:
        """Accuracy relative to the family's best (FailLite 3.2: ``a / max a``)."""
        best = self.best_accuracy
        return variant.accuracy / best if best > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    site: str
    memory_mb: float
    compute: float = 1.0

    @property
    def capacity(self) -> Demand:
        return Demand(self.memory_mb, self.compute)


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    servers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """A variant of an app's family loaded on a server."""

    server: str
    variant: str


@dataclass(frozen=True, slots=True)
class App:
    """A served application: one family, a primary placement, a request rate and an SLO.

    ``slo_ms`` of ``None`` means no latency bound; ``primary`` of ``None`` means not placed yet.
    ``replicas`` is how many servers serve it at once (its route and ``replicas - 1`` copies the
    core places); ``autoscaling``, when set, lets the load move that number between its bounds.
    """

    name: str
    family: str
    primary: Placement | None = None
    critical: bool = False
    rate_rps: float = 1.0
    slo_ms: float | None = None
    replicas: int = 1
    autoscaling: Autoscaling | None = None

    def meets_slo(self, variant: Variant) -> bool:
        return self.slo_ms is None or variant.latency_ms <= self.slo_ms + _EPS

    @property
    def min_replicas(self) -> int:
        """The replicas it starts with (and never goes below)."""
        return self.autoscaling.min_replicas if self.autoscaling is not None else self.replicas


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """Ray Serve's autoscaling config for one app: keep ``target_ongoing_requests`` requests in
    flight per replica, between ``min_replicas`` and ``max_replicas``; a decision to scale up (down)
    is carried out once it held for ``upscale_delay_s`` (``downscale_delay_s``), on the average of
    the ongoing requests over the last ``look_back_s``. (Ray Serve's defaults wait 30 s and 600 s;
    failsoft's are short, for clusters whose models load in milliseconds.)"""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    min_replicas: Annotated[int, Ge(1), Le(64)] = 1
    max_replicas: Annotated[int, Ge(1), Le(64)] = 2
    target_ongoing_requests: Annotated[float, Gt(0)] = 2.0
    upscale_delay_s: Annotated[float, Ge(0), Le(3600)] = 1.0
    downscale_delay_s: Annotated[float, Ge(0), Le(3600)] = 5.0
    look_back_s: Annotated[float, Gt(0), Le(600)] = 1.0

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"Autoscaling.min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """Parameters of the failover policies (FailLite 3.2-3.4, 5.1).

    Defined here once, with their bounds: the scenario JSON, the serving config and code that builds
    one all enforce the same annotations (see :func:`check_bounds`).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    alpha: Annotated[float, Ge(0), Le(1)] = 0.1
    site_independent: bool = False
    warm_replicas: Annotated[int, Ge(0), Le(16)] = 1
    ilp_time_limit_s: Annotated[float, Gt(0)] = 10.0
    ilp_mip_gap: Annotated[float, Ge(0), Lt(1)] = 0.01
    seed: int = 0
    reclaim_warm: bool = True  # failsoft: drop warm backups of healthy apps to recover a failed one

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True, slots=True)
class WarmBackup:
    """A variant of ``app`` kept loaded on ``server``, ready to take its traffic at once.

    A *pinned* backup belongs to a mechanism (a HAMS backup holding state, a Jellyfish neighbour
    variant): failover policies may switch to it but never release it to make room, and re-planning
    the warm backups keeps it.
    """

    app: str
    variant: str
    server: str
    pinned: bool = False


@dataclass(frozen=True)
class Scenario:
    """A snapshot of a cluster: servers, families, apps, policy parameters and warm backups.

    ``warm`` is ``None`` when the snapshot says nothing about warm backups (a policy then plans them
    itself), and a tuple (maybe empty) when they are known. ``services`` groups member apps (see
    :class:`Service`); an app in no service is served alone (a ``single`` service of its own name).
    """

    servers: tuple[Server, ...]
    families: tuple[Family, ...]
    apps: tuple[App, ...]
    policy: PolicyParams = field(default_factory=PolicyParams)
    warm: tuple[WarmBackup, ...] | None = None
    services: tuple[Service, ...] = ()
    _server_index: dict[str, Server] = field(init=False, repr=False, compare=False)
    _family_index: dict[str, Family] = field(init=False, repr=False, compare=False)
    _app_index: dict[str, App] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_server_index", {s.name: s for s in self.servers})
        object.__setattr__(self, "_family_index", {f.name: f for f in self.families})
        object.__setattr__(self, "_app_index", {a.name: a for a in self.apps})

    # lookups -------------------------------------------------------------------------------
    def server(self, name: str) -> Server:
        return self._server_index[name]

    def family(self, name: str) -> Family:
        return self._family_index[name]

    def app(self, name: str) -> App:
        return self._app_index[name]

    def has_server(self, name: str) -> bool:
        return name in self._server_index

    def has_app(self, name: str) -> bool:
        return name in self._app_index

    @property
    def sites(self) -> tuple[Site, ...]:
        by_site: dict[str, list[str]] = {}
        for s in self.servers:
            by_site.setdefault(s.site, []).append(s.name)
        return tuple(Site(name, tuple(names)) for name, names in by_site.items())

    def all_services(self) -> tuple[Service, ...]:
        """The scenario's services, plus a ``single`` service for every app none of them names."""
        cached = self.__dict__.get("_all_services")
        if cached is None:  # built once per scenario: a simulated sweep asks for it every event
            cached = with_singles(self.services, (a.name for a in self.apps))
            self.__dict__["_all_services"] = cached
        return cached

    def servers_in_sites(self, sites: Iterable[str]) -> tuple[str, ...]:
        wanted = set(sites)
        return tuple(s.name for s in self.servers if s.site in wanted)

    def variant_of(self, app: App, variant_name: str) -> Variant:
        index = self.__dict__.get("_variant_index") or self._variant_index_built()
        found = index.get((app.family, variant_name))
        return found if found is not None else self.family(app.family).variant(variant_name)

    def _variant_index_built(self) -> dict[tuple[str, str], Variant]:
        index = self.__dict__.get("_variant_index")
        if index is None:  # built on first use: (family, variant) -> Variant, a dict lookup after that
            index = {(f.name, v.name): v for f in self.families for v in f.variants}
            self.__dict__["_variant_index"] = index
        return index

    def primary_variant(self, app: App) -> Variant:
        if app.primary is None:
            raise ValueError(f"app {app.name!r} has no primary placement")
        return self.variant_of(app, app.primary.variant)

    # resources -----------------------------------------------------------------------------
    def used(self, failed: Collection[str] = (), include_warm: bool = True) -> dict[str, Demand]:
        """Demand placed on each live server by primaries (and warm backups, when known)."""
        memory = {s.name: 0.0 for s in self.servers if s.name not in failed}
        compute = dict(memory)
        placed: list[tuple[App, Placement | WarmBackup]]
        placed = [(a, a.primary) for a in self.apps if a.primary is not None]
        if include_warm and self.warm:
            placed += [(self.app(b.app), b) for b in self.warm]
        index = self._variant_index_built()
        for app, where in placed:  # floats, not Demand objects: this runs for every app of every plan
            if where.server in memory:
                v = index.get((app.family, where.variant))
                if v is None:
                    v = self.variant_of(app, where.variant)
                memory[where.server] += v.memory_mb
                compute[where.server] += app.rate_rps * v.latency_ms / 1000.0
        return {name: Demand(memory[name], compute[name]) for name in memory}

    def free(self, failed: Collection[str] = (), include_warm: bool = True) -> dict[str, Demand]:
        """Free capacity of each live server (never negative)."""
        used, servers = self.used(failed, include_warm), self._server_index
        return {  # (capacity - used).clipped(), in floats: this runs for every server of every plan
            name: Demand(
                max(servers[name].memory_mb - u.memory_mb, 0.0), max(servers[name].compute - u.compute, 0.0)
            )
            for name, u in used.items()
        }

    def replace(self, **changes: Any) -> Scenario:
        """A copy with some fields changed (the indexes are rebuilt)."""
        fields: dict[str, Any] = {
            "servers": self.servers,
            "families": self.families,
            "apps": self.apps,
            "policy": self.policy,
            "warm": self.warm,
            "services": self.services,
        }
        fields.update(changes)
        return Scenario(**fields)


# ----------------------------------------------------------------------------------------------
# Plans: what a policy decides. Plain data, turned into the plan JSON (docs/policies.md) by ``to_dict``.
# ----------------------------------------------------------------------------------------------


class ActionKind(StrEnum):
    WARM = "warm"  # switch to a warm backup that is already loaded
    PROGRESSIVE = "progressive"  # load first_variant, serve it, then upgrade to final_variant
    COLD = "cold"  # load final_variant from disk and serve it when ready (full-size baselines)


@dataclass(frozen=True, slots=True)
class ProactivePlan:
    """Warm backups chosen for the critical apps (FailLite step 1)."""

    policy: str
    warm: tuple[WarmBackup, ...]
    unplaced: tuple[str, ...]
    objective: float
    solve_ms: float
    mip_gap: float | None = None
    optimal: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "warm": [{"app": w.app, "variant": w.variant, "server": w.server} for w in self.warm],
            "unplaced": list(self.unplaced),
            "objective": _round(self.objective),
            "solve_ms": _round(self.solve_ms),
            "mip_gap": None if self.mip_gap is None else _round(self.mip_gap, 6),
            "optimal": self.optimal,
        }


@dataclass(frozen=True, slots=True)
class FailoverAction:
    """Serve ``app`` on ``server`` with ``final_variant``; progressive actions first serve
    ``first_variant`` on ``first_server`` (``None``: the same server) while the final one loads."""

    app: str
    kind: ActionKind
    server: str
    first_variant: str
    final_variant: str
    first_server: str | None = None

    @property
    def stand_in_server(self) -> str:
        """Where ``first_variant`` serves."""
        return self.first_server or self.server


@dataclass(frozen=True, slots=True)
class FailoverPlan:
    """How the apps hit by a failure are recovered (FailLite step 2)."""

    policy: str
    failed: tuple[str, ...]
    actions: tuple[FailoverAction, ...]
    unrecovered: tuple[str, ...]
    plan_ms: float
    released: tuple[WarmBackup, ...] = ()  # warm backups unloaded to make room, before any load

    def action_for(self, app: str) -> FailoverAction | None:
        for action in self.actions:
            if action.app == app:
                return action
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "failed": list(self.failed),
            "actions": [
                {
                    "app": a.app,
                    "kind": a.kind.value,
                    "server": a.server,
                    "first_variant": a.first_variant,
                    "final_variant": a.final_variant,
                    "first_server": a.stand_in_server,
                }
                for a in self.actions
            ],
            "unrecovered": list(self.unrecovered),
            "released_warm": [
                {"app": w.app, "variant": w.variant, "server": w.server} for w in self.released
            ],
            "plan_ms": _round(self.plan_ms),
        }


# ----------------------------------------------------------------------------------------------
# Life cycles shared by the runtime and the simulator.
# ----------------------------------------------------------------------------------------------


class ServerState(StrEnum):
    UP = "up"
    SUSPECT = "suspect"
    FAILED = "failed"
    RECOVERING = "recovering"


class BackupState(StrEnum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"
    ACTIVE = "active"


def _round(value: float, digits: int = 3) -> float:
    if math.isnan(value) or math.isinf(value):
        return value
    return round(value, digits)
