"""The serving config (``failsoft serve CONFIG.yaml``): validated once, at the edge, then frozen.

A config names the cluster (servers with their site, memory and compute), the apps (family,
criticality, request rate, SLO, optionally where and on which variant the primary runs), the model
repository, the failover policy and its parameters (FailLite 3.2-3.4), and the runtime settings:
heartbeats (FailLite 4: every 20 ms, two missed mark a server failed), the gateway's address, the
state directory and store, the admin token::

    name: edge
    servers:
      - {name: s1, site: edge-a, memory_mb: 64, compute: 1.0}
      - {name: g1, site: edge-a, memory_mb: 8000, device: cuda, gpus: 0.5}  # half a GPU (devices.py)
    apps:
      - {name: cam-1, family: digits_cnn, critical: true, rate_rps: 20, slo_ms: 50,
         primary: {server: s1, variant: cnn_large}}
    failover: {policy: faillite, alpha: 0.1, site_independent: true}
    heartbeat: {interval_ms: 20, missed: 2}
    gateway: {host: 127.0.0.1, port: 8000}   # inference; admin on 127.0.0.1:8001 (admin_host, admin_port)
    store: sqlite            # or sqlite:///path/state.db, or redis://127.0.0.1:6379/0
    telemetry: {traces: none, log_format: text, access_log: true}   # or traces: otlp|console, json logs

Anything wrong is refused with one :class:`~failsoft.errors.ConfigError` naming the bad entry and value
(the same one-line format as the scenario JSON), before any process starts. Families are checked
against the model repository later, by :func:`failsoft.runtime.deployment.resolve`.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model, field_validator

from failsoft.domain import Autoscaling, PolicyParams, Server
from failsoft.errors import ConfigError
from failsoft.policies.queueing import QueueParams
from failsoft.policies.registry import failover_names as policy_names
from failsoft.policies.registry import names as registered
from failsoft.runtime.devices import DEVICE_PATTERN, MAX_GPUS, Placement, check_placement
from failsoft.runtime.llm_config import LlmServiceModel, LlmServing, is_llm_entry, llm_serving
from failsoft.runtime.security import MIN_TOKEN_CHARS, TlsSettings
from failsoft.runtime.telemetry import TelemetrySettings
from failsoft.scenario import (  # one-line errors, one service parser
    ServiceSpec,
    _refuse_duplicates,
    build_services,
    read_document,
    validate_document,
)
from failsoft.services import GraphNode, GraphParams, Service
from failsoft.zoo.repository import resolve_repository

DEFAULT_PORT = 8000
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerModel(_Strict):
    name: str = Field(pattern=_NAME, max_length=64)
    site: str = Field(pattern=_NAME, max_length=64)
    memory_mb: float = Field(gt=0)
    compute: float = Field(default=1.0, gt=0)
    device: str | None = Field(default=None, pattern=DEVICE_PATTERN)  # default: agents.device
    gpus: float | None = Field(default=None, ge=0, le=MAX_GPUS)  # its GPU share; default: agents.gpus


class PrimaryModel(_Strict):
    server: str | None = None
    variant: str | None = None


class AppModel(_Strict):
    name: str = Field(pattern=_NAME, max_length=64)
    family: str = Field(min_length=1)
    critical: bool = False
    rate_rps: float = Field(default=1.0, ge=0)
    slo_ms: float | None = Field(default=None, gt=0)
    primary: PrimaryModel | None = None
    replicas: int | None = Field(default=None, ge=1, le=64)  # fixed; or autoscaling, not both
    autoscaling: Autoscaling | None = None


def _policy_fields() -> dict[str, Any]:
    """PolicyParams' fields with their annotated bounds and defaults: the config's ``failover``
    section states them flat beside ``policy``, and they are defined once, in the domain."""
    hints = typing.get_type_hints(PolicyParams, include_extras=True)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(PolicyParams)}


_PolicyFields: type[BaseModel] = create_model("_PolicyFields", __base__=_Strict, **_policy_fields())


class FailoverModel(_PolicyFields):  # type: ignore[misc,valid-type]
    policy: str = "faillite"
    replan_delay_s: float = Field(default=3.0, ge=0, le=3600)

    def params(self) -> PolicyParams:
        return PolicyParams(**self.model_dump(exclude={"policy", "replan_delay_s"}))

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in policy_names():
            raise ValueError(f"unknown failover policy (known: {', '.join(policy_names())})")
        return value


class HeartbeatModel(_Strict):
    interval_ms: float = Field(default=20.0, ge=1, le=10_000)
    missed: int = Field(default=2, ge=1, le=100)


class TlsModel(_Strict):
    """A PEM certificate (chain) and its private key: uvicorn's ``ssl_certfile`` / ``ssl_keyfile``."""

    certfile: str = Field(min_length=1)
    keyfile: str = Field(min_length=1)


class GatewayModel(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    tls: TlsModel | None = None
    # the admin plane (status, chaos) listens apart from inference: default 127.0.0.1, port + 1
    admin_host: str = "127.0.0.1"
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    admin_tls: TlsModel | None = None
    max_body_mb: float = Field(default=16.0, gt=0, le=1024)
    max_batch: int = Field(default=64, ge=1, le=4096)
    min_timeout_ms: float = Field(default=2000.0, ge=1)
    # a non-loopback admin_host exposes the admin API (it kills processes): only when opted in
    allow_remote: bool = False
    # app-level health: a server is failed over after this many consecutive inference errors or
    # timeouts with no success between them (it heartbeats, but does not serve)
    unhealthy_after: int = Field(default=10, ge=1, le=10_000)


class AgentsModel(_Strict):
    restart: bool = True
    max_parallel_loads: int = Field(default=2, ge=1, le=64)
    # of those, how many heavy loads (20 ms of work or more) at once; None: one per core the host
    # leaves once a core is set aside for answering (orchestration.loads.heavy_load_slots)
    max_parallel_heavy_loads: int | None = Field(default=None, ge=1, le=64)
    # ... counted over every server together (an embedded cluster's servers share this host's cores)
    # rather than per server
    heavy_loads_per_host: bool = False
    device: str = Field(default="auto", pattern=DEVICE_PATTERN)  # see failsoft.runtime.devices
    gpus: float = Field(default=0.0, ge=0, le=MAX_GPUS)  # each server's GPU share unless it sets its own
    drain_ms: float = Field(default=200.0, ge=0)
    torch_threads: int = Field(default=1, ge=0, le=256)
    queue: QueueParams = Field(default_factory=QueueParams)  # every loaded model's serving queue

    @field_validator("queue")
    @classmethod
    def _known_discipline(cls, value: QueueParams) -> QueueParams:
        if value.discipline not in registered("queueing"):
            known = ", ".join(registered("queueing"))
            raise ValueError(f"unknown queue discipline {value.discipline!r} (known: {known})")
        return value


class TelemetryModel(_Strict):
    """Traces, log format and access log (docs/operations.md, "Watching it")."""

    traces: Literal["none", "console", "otlp"] = "none"
    log_format: Literal["text", "json"] = "text"
    access_log: bool = True


def _service_kind(value: Any) -> str:
    return "llm" if is_llm_entry(value) else "apps"


# a service groups apps of the repository, or (mode llm) LLM workers with their own schema
ServiceEntry = typing.Annotated[
    typing.Annotated[ServiceSpec, Tag("apps")] | typing.Annotated[LlmServiceModel, Tag("llm")],
    Discriminator(_service_kind),
]


class ConfigModel(_Strict):
    name: str = Field(default="failsoft", pattern=_NAME, max_length=64)
    repository: str | None = None
    servers: list[ServerModel] = Field(min_length=1)
    apps: list[AppModel] = Field(default_factory=list)  # none: only llm services
    services: list[ServiceEntry] = Field(default_factory=list)
    failover: FailoverModel = Field(default_factory=FailoverModel)
    heartbeat: HeartbeatModel = Field(default_factory=HeartbeatModel)
    gateway: GatewayModel = Field(default_factory=GatewayModel)
    agents: AgentsModel = Field(default_factory=AgentsModel)
    telemetry: TelemetryModel = Field(default_factory=TelemetryModel)
    state_dir: str | None = None
    store: str = "sqlite"
    admin_token: str | None = Field(default=None, min_length=MIN_TOKEN_CHARS)

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if not _is_store_url(value):
            raise ValueError("store must be 'sqlite', 'sqlite:///PATH' or 'redis://HOST:PORT/DB'")
        return value


def _is_store_url(value: str) -> bool:
    return value == "sqlite" or value.startswith(("sqlite:///", "redis://", "rediss://", "unix://"))


def config_store_url(value: str) -> str:
    """A store URL given on the command line, checked like the config's ``store``."""
    if not _is_store_url(value):
        raise ConfigError(f"--store {value!r}: use 'sqlite', 'sqlite:///PATH' or 'redis://HOST:PORT/DB'")
    return value


# ----------------------------------------------------------------------------------------------
# The frozen result every runtime part reads.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppConfig:
    """An app as the config states it; ``server``/``variant`` of ``None`` are chosen at deploy."""

    name: str
    family: str
    critical: bool
    rate_rps: float
    slo_ms: float | None
    server: str | None
    variant: str | None
    replicas: int = 1  # servers serving it at once (autoscaling's min_replicas when it scales)
    autoscaling: Autoscaling | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatSettings:
    interval_s: float = 0.020
    missed_to_fail: int = 2


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The data plane (inference, events, metrics) on ``host:port``, the admin plane (status,
    chaos) on ``admin_host:admin_port``, each in plain HTTP or, with its ``tls``, HTTPS."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_body_bytes: int = 16 * 1024 * 1024
    max_batch: int = 64
    min_timeout_ms: float = 2000.0
    allow_remote: bool = False  # the admin plane may bind a non-loopback host (docs/security.md)
    unhealthy_after: int = 10  # consecutive failed inferences on a server before it is failed over
    tls: TlsSettings | None = None
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None  # None: port + 1 (0, any free port, when port is 0)
    admin_tls: TlsSettings | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{_url_host(self.host)}:{self.port}"

    @property
    def admin_bind_port(self) -> int:
        if self.admin_port is not None:
            return self.admin_port
        return 0 if self.port == 0 else self.port + 1

    @property
    def admin_url(self) -> str:
        return (
            f"{'https' if self.admin_tls else 'http'}://{_url_host(self.admin_host)}:{self.admin_bind_port}"
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class AgentSettings:
    restart: bool = True
    max_parallel_loads: int = 2
    device: str = "auto"
    drain_ms: float = 200.0
    torch_threads: int = 1  # per agent; 0 = one per core (torch's default)
    queue: QueueParams = dataclasses.field(default_factory=QueueParams)  # discipline, max_batch, max_queue
    max_parallel_heavy_loads: int | None = None  # None: from the host's cores (see AgentsModel)
    heavy_loads_per_host: bool = False  # the heavy-load limit counts every server together


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything ``failsoft serve`` needs, validated. Change it with :meth:`replace`, never in place."""

    name: str
    source: str
    servers: tuple[Server, ...]
    apps: tuple[AppConfig, ...]
    services: tuple[Service, ...]  # the config's own; apps in none are served alone
    repository: Path  # the config's, else $FAILSOFT_ZOO, else the default (resolve_repository)
    policy: str
    params: PolicyParams
    replan_delay_s: float
    heartbeat: HeartbeatSettings
    gateway: GatewaySettings
    agents: AgentSettings
    state_dir: Path
    store_url: str
    admin_token: str | None
    placements: tuple[tuple[str, Placement], ...] = ()  # per server: device and GPU share
    telemetry: TelemetrySettings = dataclasses.field(default_factory=TelemetrySettings)
    llm: tuple[LlmServing, ...] = ()  # the llm services (their members are LLM workers, not apps)

    def replace(self, **changes: Any) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)

    def with_gateway(self, **changes: Any) -> RuntimeConfig:
        return self.replace(gateway=dataclasses.replace(self.gateway, **changes))

    def with_agents(self, **changes: Any) -> RuntimeConfig:
        return self.replace(agents=dataclasses.replace(self.agents, **changes))

    def server(self, name: str) -> Server:
        for s in self.servers:
            if s.name == name:
                return s
        raise ConfigError(f"no server {name!r} in config {self.source!r}")

    def placement(self, server: str) -> Placement:
        """Where ``server``'s agent runs models and the GPU share it asks Ray for."""
        return dict(self.placements).get(server, Placement(self.agents.device))

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.site for s in self.servers))


def default_state_dir() -> Path:
    """``$FAILSOFT_STATE``, else ``~/.local/state/failsoft``."""
    env = os.environ.get("FAILSOFT_STATE")
    return Path(env).expanduser() if env else Path.home() / ".local" / "state" / "failsoft"


def load_config(path: str | Path) -> RuntimeConfig:
    """Read, validate and freeze a YAML config; any problem is one ConfigError naming the entry."""
    path = Path(path)
    text = read_document(path, "config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config {str(path)!r} is not valid YAML: {problem}{where}") from exc
    return config_from_dict(data, source=str(path), base_dir=path.parent)


def config_from_dict(data: Any, source: str = "config", base_dir: Path | None = None) -> RuntimeConfig:
    """Validate a parsed config (relative paths resolve against ``base_dir``)."""
    spec = validate_document(ConfigModel, data, source, "a mapping")
    return _freeze(spec, source, base_dir or Path.cwd())


def _freeze(spec: ConfigModel, source: str, base_dir: Path) -> RuntimeConfig:
    _refuse_duplicates(source, "server", [s.name for s in spec.servers])
    _refuse_duplicates(source, "app", [a.name for a in spec.apps])
    servers = tuple(Server(s.name, s.site, s.memory_mb, s.compute) for s in spec.servers)
    placements = _placements(spec, source)
    names = {s.name for s in servers}
    apps = []
    for i, a in enumerate(spec.apps):
        primary = a.primary or PrimaryModel()
        if primary.server is not None and primary.server not in names:
            raise ConfigError(
                f"{source}: apps[{i}] ({a.name!r}): primary server {primary.server!r} does not exist "
                f"(servers: {', '.join(sorted(names))})"
            )
        apps.append(
            AppConfig(
                a.name,
                a.family,
                a.critical,
                a.rate_rps,
                a.slo_ms,
                primary.server,
                primary.variant,
                _replicas(a, i, len(servers), source),
                a.autoscaling,
            )
        )
    app_services = [s for s in spec.services if isinstance(s, ServiceSpec)]
    services = build_services(app_services, {a.name: a for a in apps}, source)
    _check_scaled_members(services, apps, source)
    llm = _llm_services(spec, source, base_dir, {a.name for a in apps} | {s.name for s in services})
    if not apps and not llm:
        raise ConfigError(f"{source}: apps: the config serves nothing (no app and no llm service)")
    repository = resolve_repository(_path(spec.repository, base_dir) if spec.repository else None)
    _check_graph_state(services, {a.name: a for a in apps}, repository, source)
    state_dir = _path(spec.state_dir, base_dir) if spec.state_dir else default_state_dir() / spec.name
    f = spec.failover
    params = f.params()
    g, h, ag = spec.gateway, spec.heartbeat, spec.agents
    return RuntimeConfig(
        name=spec.name,
        source=source,
        servers=servers,
        apps=tuple(apps),
        services=services,
        repository=repository,
        policy=f.policy,
        params=params,
        replan_delay_s=f.replan_delay_s,
        heartbeat=HeartbeatSettings(h.interval_ms / 1000.0, h.missed),
        gateway=GatewaySettings(
            g.host,
            g.port,
            int(g.max_body_mb * 1024 * 1024),
            g.max_batch,
            g.min_timeout_ms,
            allow_remote=g.allow_remote,
            unhealthy_after=g.unhealthy_after,
            tls=_tls(g.tls, base_dir, source, "gateway.tls"),
            admin_host=g.admin_host,
            admin_port=_admin_port(g, source),
            admin_tls=_tls(g.admin_tls, base_dir, source, "gateway.admin_tls"),
        ),
        agents=AgentSettings(
            ag.restart,
            ag.max_parallel_loads,
            ag.device,
            ag.drain_ms,
            ag.torch_threads,
            ag.queue,
            ag.max_parallel_heavy_loads,
            ag.heavy_loads_per_host,
        ),
        state_dir=state_dir,
        store_url=spec.store,
        admin_token=spec.admin_token,
        placements=placements,
        telemetry=TelemetrySettings(
            spec.telemetry.traces, spec.telemetry.log_format, spec.telemetry.access_log
        ),
        llm=llm,
    )


def _replicas(a: AppModel, i: int, servers: int, source: str) -> int:
    """An app's starting replica count; one replica per server at most (each is a copy on its own)."""
    where = f"{source}: apps[{i}] ({a.name!r})"
    if a.replicas is not None and a.autoscaling is not None:
        raise ConfigError(f"{where}: give replicas (a fixed count) or autoscaling, not both")
    most = a.autoscaling.max_replicas if a.autoscaling is not None else (a.replicas or 1)
    if most > servers:
        key = "autoscaling.max_replicas" if a.autoscaling is not None else "replicas"
        raise ConfigError(f"{where}: {key} is {most}, but there are {servers} servers (one replica each)")
    return a.autoscaling.min_replicas if a.autoscaling is not None else (a.replicas or 1)


def _check_scaled_members(services: tuple[Service, ...], apps: list[AppConfig], source: str) -> None:
    """Replicas are for apps served alone: a service's mechanism decides where its members serve."""
    scaled = {a.name for a in apps if a.replicas > 1 or a.autoscaling is not None}
    for service in services:
        for member in service.members:
            if member in scaled:
                raise ConfigError(
                    f"{source}: app {member!r} has replicas or autoscaling but is a member of "
                    f"service {service.name!r} ({service.mode.value}): only apps served alone scale"
                )


def _llm_services(spec: ConfigModel, source: str, base_dir: Path, taken: set[str]) -> tuple[LlmServing, ...]:
    """The ``mode: llm`` entries of ``services``, validated (their names must not be taken)."""
    servers = tuple(s.name for s in spec.servers)
    out = []
    for i, entry in enumerate(spec.services):
        if isinstance(entry, LlmServiceModel):
            where = f"{source}: services[{i}] ({entry.name!r})"
            if entry.name in taken:
                raise ConfigError(f"{where}: the name is taken by another app or service")
            taken.add(entry.name)
            out.append(llm_serving(entry, where, servers, base_dir))
    return tuple(out)


def _placements(spec: ConfigModel, source: str) -> tuple[tuple[str, Placement], ...]:
    """Each server's device and GPU share (its own, else ``agents``'), checked together."""
    ag = spec.agents
    out = []
    for i, s in enumerate(spec.servers):
        device = s.device if s.device is not None else ag.device
        gpus = s.gpus if s.gpus is not None else ag.gpus
        out.append((s.name, check_placement(f"{source}: servers[{i}] ({s.name!r})", device, gpus)))
    return tuple(out)


def _check_graph_state(
    services: tuple[Service, ...], apps: dict[str, AppConfig], repository: Path, source: str
) -> None:
    """HAMS: a stateful node of a ``graph`` service must run a model that exposes its state (its
    backup needs ``state()``/``apply_state()``), the node's variant or else its app's (any of the
    family's when the deployment picks it); refused here, before anything is deployed."""
    from failsoft.graphs import check_stateful_variants
    from failsoft.zoo.catalog import exposes_state

    def exposes(node: GraphNode) -> bool:
        app = apps[node.app]
        return exposes_state(app.family, node.variant or app.variant, repository)

    for i, service in enumerate(services):
        if isinstance(service.params, GraphParams):
            try:
                check_stateful_variants(service.params, exposes)
            except ConfigError as exc:
                raise ConfigError(f"{source}: services[{i}] ({service.name!r}): {exc}") from exc


def _tls(spec: TlsModel | None, base_dir: Path, source: str, where: str) -> TlsSettings | None:
    """The TLS files, resolved against the config's directory; a missing one is refused here."""
    if spec is None:
        return None
    tls = TlsSettings(_path(spec.certfile, base_dir), _path(spec.keyfile, base_dir))
    for name, path in (("certfile", tls.certfile), ("keyfile", tls.keyfile)):
        if not path.is_file():
            raise ConfigError(f"{source}: {where}.{name}: no such file {str(path)!r}")
    return tls


def _admin_port(g: GatewayModel, source: str) -> int | None:
    """The admin port as given; refused when it is the inference port, or port + 1 does not exist."""
    if g.admin_port is None and g.port == 65535:
        raise ConfigError(
            f"{source}: gateway.port 65535 leaves no port + 1 for the admin API: set gateway.admin_port"
        )
    if g.admin_port is not None and g.admin_port == g.port != 0:
        raise ConfigError(
            f"{source}: gateway.admin_port {g.admin_port} is the inference port: the admin API needs its own"
        )
    return g.admin_port


def _path(value: str, base_dir: Path) -> Path:
    path = Path(os.path.expandvars(value)).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()
