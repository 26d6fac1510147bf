"""Services: named groups of member apps, each served by one mechanism (its *mode*).

FailLite gives every app one placement and one route. The other mechanisms serve *groups*:

==========  ===============================================================  =========================
mode        members                                                          mechanism (paper)
==========  ===============================================================  =========================
``single``  one app                                                          FailLite failover
``coded``   ``k`` data instances, then ``r`` parity instances                ParM coded inference
``slo``     workers of one family, clients mapped to them                    Jellyfish SLO dispatch
``graph``   one app per node of a model DAG                                  HAMS primary-backup
``llm``     ``N`` LLM workers                                                LUMEN recovery
==========  ===============================================================  =========================

A member app keeps one placement, so the failover policies plan it exactly like any app (a parity
instance or an LLM worker fails over like a single app); the service's mode decides how the gateway
*dispatches* a request over its members. Each mode has one frozen parameter class whose bounds are
annotations (enforced by pydantic when a config is parsed, and by :func:`~failsoft.bounds.check_bounds`
when one is built in code). An app that no service names is served alone by an implicit ``single``
service of the same name, which is how every FailLite config keeps working unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, Le

from failsoft.bounds import STRICT, check_bounds
from failsoft.errors import ConfigError


class ServiceMode(StrEnum):
    SINGLE = "single"
    CODED = "coded"
    SLO = "slo"
    GRAPH = "graph"
    LLM = "llm"


@dataclass(frozen=True, slots=True)
class SingleParams:
    """An app served alone (FailLite): no parameters; exactly one member."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    def check_members(self, service: str, members: tuple[str, ...]) -> None:
        _count(service, "single", members, 1, 1)


@dataclass(frozen=True, slots=True)
class CodedParams:
    """ParM (sections 3-4, 7): ``k`` queries are encoded into ``r`` parity queries.

    Members: the ``k`` data instances first, then the ``r`` parity instances. The ``add`` encoder sums
    the queries (k in 2..4); ``concat`` tiles k images into one (k of 2 or 4, the paper's layouts).
    A group waits at most ``fill_timeout_ms`` for its k-th query, so a lone query is never held.
    ``fill``: ``rate`` (the default) waits the time in which the k-th query arrives with probability
    0.99 at the measured arrival rate, capped at ``fill_timeout_ms``; ``fixed`` waits
    ``fill_timeout_ms`` (``failsoft.policies.coding.fill``).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    k: Annotated[int, Ge(2), Le(4)] = 2
    r: Annotated[int, Ge(1), Le(4)] = 1
    encoder: Literal["add", "concat"] = "add"
    fill_timeout_ms: Annotated[float, Gt(0), Le(10_000)] = 100.0
    fill: Literal["rate", "fixed"] = "rate"

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.encoder not in ("add", "concat"):
            raise ValueError(f"CodedParams.encoder must be 'add' or 'concat'; got {self.encoder!r}")
        if self.fill not in ("rate", "fixed"):
            raise ValueError(f"CodedParams.fill must be 'rate' or 'fixed'; got {self.fill!r}")
        if self.encoder == "concat" and self.k not in (2, 4):
            raise ValueError(f"CodedParams: the concat encoder takes k of 2 or 4; got k={self.k}")

    def check_members(self, service: str, members: tuple[str, ...]) -> None:
        _count(service, "coded", members, self.k + self.r, self.k + self.r, "k + r")


@dataclass(frozen=True, slots=True)
class SloParams:
    """Jellyfish (sections 3.3, 4): workers of one family serve clients under end-to-end SLOs.

    ``slo_ms`` is the SLO of a client that states none; the gateway's slo dispatcher re-plans the
    client-to-worker mapping and the workers' variants every ``replan_s``; a plan's batches go up
    to ``max_batch``. ``policy`` is the adaptation policy: ``jellyfish`` (mapping DP + annealing),
    or one of the paper's Clockwork-style baselines ``edf-small|medium|large`` (one fixed variant on
    every worker, every client's frames to the least busy worker; run their agents with the ``edf``
    queue discipline, as ``failsoft bench adaptation`` does).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    slo_ms: Annotated[float, Gt(0), Le(60_000)] = 100.0
    replan_s: Annotated[float, Gt(0), Le(3600)] = 0.5
    max_batch: Annotated[int, Ge(1), Le(64)] = 8
    policy: Literal["jellyfish", "edf-small", "edf-medium", "edf-large"] = "jellyfish"

    def __post_init__(self) -> None:
        check_bounds(self)

    def check_members(self, service: str, members: tuple[str, ...]) -> None:
        _count(service, "slo", members, 1, 256)


@dataclass(frozen=True, slots=True)
class GraphNode:
    """A node of a service graph: the member app that computes it, and whether it keeps state.

    ``variant`` names the model variant the node runs ("" for its app's primary variant); a stateful
    node's variant must expose ``state()`` and ``apply_state()``. ``batch_size`` is the most requests
    one call computes; ``dynamic_batching`` batches what is queued up to it, otherwise a batch is
    padded to ``batch_size`` (the HAMS format's negative and positive sizes). ``joins`` names the
    upstream nodes whose outputs for one request this node joins (a fan-in, HAMS ``reduce``): it must
    list exactly the node's inputs, and a node with several inputs must declare it.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    name: str
    app: str
    stateful: bool = False
    variant: str = ""
    batch_size: Annotated[int, Ge(1), Le(4096)] = 1
    dynamic_batching: bool = False
    joins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True, slots=True)
class GraphParams:
    """HAMS (sections III-IV): a DAG of models; stateful nodes get a primary-backup pair.

    ``edges`` are ``(upstream, downstream)`` node names; the graph must be acyclic, every edge must
    name known nodes, and every member app computes exactly one node. ``replication`` is how the
    stateful nodes survive a failed primary: ``nspb`` (a backup copy, the state shipped without
    stopping the pipeline, HAMS), ``stop-and-copy`` (Remus: a node's output is held until the state
    after it is at the backup, the primary computing on meanwhile) or ``none`` (no backup: a failed
    stateful node starts over from its initial state on the controller's fresh copy); the baselines
    ``failsoft bench replication`` runs.
    ``ship_interval_ms`` spaces a stateful node's state transfers (0: after every request, as HAMS
    does; more: the newest state at most that often, fewer calls on a busy machine for a backup
    that lags by the requests of one interval, which a failover replays).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    nodes: tuple[GraphNode, ...] = ()
    edges: tuple[tuple[str, str], ...] = ()
    replication: Literal["nspb", "stop-and-copy", "none"] = "nspb"
    ship_interval_ms: Annotated[float, Ge(0), Le(60_000)] = 0.0

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        dupes = [n for n, c in Counter(names).items() if c > 1]
        if dupes:
            raise ValueError(f"GraphParams: duplicate node {dupes[0]!r}")
        known = set(names)
        for up, down in self.edges:
            for end in (up, down):
                if end not in known:
                    raise ValueError(f"GraphParams: edge ({up!r}, {down!r}) names unknown node {end!r}")
        cycle = _cycle(names, self.edges)
        if cycle:
            raise ValueError(f"GraphParams: the graph has a cycle through node {cycle!r}")
        _check_fan_in(self.nodes, self.edges)
        check_bounds(self)

    def check_members(self, service: str, members: tuple[str, ...]) -> None:
        _count(service, "graph", members, 1, 256)
        by_node = sorted(n.app for n in self.nodes)
        if by_node != sorted(members):
            raise ConfigError(
                f"service {service!r}: graph nodes compute apps {by_node}, but its members are "
                f"{sorted(members)} (each member computes exactly one node)"
            )


@dataclass(frozen=True, slots=True)
class LlmParams:
    """LUMEN: ``N`` LLM workers; KV checkpoints to peers within ``checkpoint_budget_mb`` per worker.

    ``alpha`` and ``beta`` weigh held KV and queue length in a peer's expected recovery load
    (L = alpha * KV + beta * queue); ``theta`` and ``tau`` are the overload thresholds of the
    locality-aware recovery dispatch; ``draft_tokens`` is the speculation length of progressive
    recovery. The review leaves all five open: failsoft's values and their sweeps are documented
    with the mechanism.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT

    checkpoint_budget_mb: Annotated[float, Ge(0)] = 40960.0  # 0: no checkpoints
    alpha: Annotated[float, Ge(0)] = 1.0  # per GB of KV checkpoints held
    beta: Annotated[float, Ge(0)] = 1.0  # per request in flight
    theta: Annotated[float, Gt(0)] = 2.0  # times the up workers' mean load
    tau: Annotated[int, Ge(1)] = 32  # KV pages of 16 tokens (512 tokens)
    draft_tokens: Annotated[int, Ge(1), Le(16)] = 3  # best of the simulator sweep (docs/lumen.md)

    def __post_init__(self) -> None:
        check_bounds(self)

    def check_members(self, service: str, members: tuple[str, ...]) -> None:
        _count(service, "llm", members, 1, 256)


ServiceParams = SingleParams | CodedParams | SloParams | GraphParams | LlmParams

PARAMS_OF_MODE: Mapping[ServiceMode, type] = {
    ServiceMode.SINGLE: SingleParams,
    ServiceMode.CODED: CodedParams,
    ServiceMode.SLO: SloParams,
    ServiceMode.GRAPH: GraphParams,
    ServiceMode.LLM: LlmParams,
}


@dataclass(frozen=True, slots=True)
class Service:
    """A named group of member apps served by one mode; ``params`` is that mode's parameter class."""

    name: str
    mode: ServiceMode
    members: tuple[str, ...]
    params: ServiceParams

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", ServiceMode(self.mode))
        except ValueError:
            known = ", ".join(m.value for m in ServiceMode)
            raise ConfigError(f"service {self.name!r}: unknown mode {self.mode!r} (known: {known})") from None
        object.__setattr__(self, "members", tuple(self.members))
        expected = PARAMS_OF_MODE[self.mode]
        if not isinstance(self.params, expected):
            raise ConfigError(
                f"service {self.name!r}: mode {self.mode.value!r} takes {expected.__name__}, "
                f"got {type(self.params).__name__}"
            )
        dupes = [m for m, c in Counter(self.members).items() if c > 1]
        if dupes:
            raise ConfigError(f"service {self.name!r}: member {dupes[0]!r} is named twice")
        self.params.check_members(self.name, self.members)

    @classmethod
    def single(cls, app: str) -> Service:
        return cls(app, ServiceMode.SINGLE, (app,), SingleParams())


def with_singles(services: Iterable[Service], apps: Iterable[str]) -> tuple[Service, ...]:
    """``services`` plus a ``single`` service for every app that none of them names."""
    services = tuple(services)
    named = {m for s in services for m in s.members}
    return services + tuple(Service.single(a) for a in apps if a not in named)


def check_services(services: Iterable[Service], apps: Mapping[str, Any], source: str = "config") -> None:
    """Services against the apps they group: known members, each app in one service at most, and
    service names that do not take the name of an app they do not serve alone.

    ``apps`` maps app names to anything with a ``family`` attribute; the data members of a coded
    service must share one family (they serve one deployed model).
    """
    owner: dict[str, str] = {}
    names = Counter(s.name for s in services)
    for service in services:
        if names[service.name] > 1:
            raise ConfigError(f"{source}: duplicate service name {service.name!r}")
        for member in service.members:
            if member not in apps:
                raise ConfigError(
                    f"{source}: service {service.name!r}: member {member!r} is not an app of the config"
                )
            if member in owner:
                raise ConfigError(
                    f"{source}: app {member!r} is a member of both {owner[member]!r} and {service.name!r}"
                )
            owner[member] = service.name
        alone = service.mode is ServiceMode.SINGLE and service.members == (service.name,)
        if service.name in apps and not alone:
            raise ConfigError(
                f"{source}: service {service.name!r} has the name of an app; service and app names "
                f"share the gateway's model namespace"
            )
        if isinstance(service.params, CodedParams):
            data = service.members[: service.params.k]
            families = {apps[m].family for m in data}
            if len(families) > 1:
                raise ConfigError(
                    f"{source}: coded service {service.name!r}: its data members {list(data)} serve "
                    f"different families {sorted(families)} (a coding group serves one model)"
                )


def _count(service: str, mode: str, members: tuple[str, ...], least: int, most: int, what: str = "") -> None:
    if not least <= len(members) <= most:
        want = f"{least}" if least == most else f"{least} to {most}"
        how = f" ({what})" if what else ""
        raise ConfigError(
            f"service {service!r}: a {mode} service has {want} members{how}, got {len(members)}"
        )


def _check_fan_in(nodes: tuple[GraphNode, ...], edges: tuple[tuple[str, str], ...]) -> None:
    """Every node with several inputs joins exactly those inputs (HAMS joins a fan-in by request)."""
    inputs: dict[str, list[str]] = {n.name: [] for n in nodes}
    for up, down in edges:
        inputs[down].append(up)
    for node in nodes:
        have = sorted(inputs[node.name])
        dupes = [n for n, c in Counter(node.joins).items() if c > 1]
        if dupes:
            raise ValueError(f"GraphParams: node {node.name!r} joins {dupes[0]!r} twice")
        if node.joins and sorted(node.joins) != have:
            raise ValueError(
                f"GraphParams: node {node.name!r} joins {sorted(node.joins)}, but its inputs are {have} "
                f"(a fan-in joins exactly the node's inputs)"
            )
        if len(have) > 1 and not node.joins:
            raise ValueError(
                f"GraphParams: node {node.name!r} has inputs {have} but declares no join of them "
                f"(list them in its 'joins')"
            )


def _cycle(nodes: list[str], edges: tuple[tuple[str, str], ...]) -> str | None:
    """A node on a cycle of the directed graph, or None (Kahn's algorithm)."""
    indegree = dict.fromkeys(nodes, 0)
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for up, down in edges:
        out[up].append(down)
        indegree[down] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for nxt in out[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if seen == len(nodes):
        return None
    return sorted(n for n, d in indegree.items() if d > 0)[0]
